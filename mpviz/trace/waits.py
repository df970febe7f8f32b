"""Blocking waits: a thread that stops until someone else does something is an event, twice.

A program that hangs is a program in which some thread waits for something that never comes.
To see that in a trace, every wait that can hang records when it starts and when it ends::

    p.join()              wait.begin {on: "process", id: <child pid>, name}   ... wait.end {ok}
    q.get(), nothing in q wait.begin {on: "queue.get", id: <queue id>, timeout}  ... its queue.get
    q.put(x), q full      wait.begin {on: "queue.put", id: <queue id>, maxsize, timeout} ... wait.end
    q.join()              wait.begin {on: "queue.join", id: <queue id>}       ... wait.end
    ev.wait()             wait.begin {on: "event", id: <its semaphore>}       ... wait.end {ok}
    cond.wait()           wait.begin {on: "condition", id: <its lock>}        ... wait.end {ok}
    barrier.wait()        wait.begin {on: "barrier", id}                      ... wait.end
    res.get() / pool.map  wait.begin {on: "pool.result", id: <job>}           ... wait.end
    fut.result(), wait(), as_completed()   {on: "future", task, job or runner: _future_task}
    a feeder thread's write into a full pipe   {on: "pipe.write", id: <queue id>, nbytes}
    a process at exit, waiting for its queue's feeder to finish writing
                          wait.begin {on: "thread", id: <feeder's OS thread id>, name, at_exit}
    (``at_exit: true`` on a join made by multiprocessing's exit function: see _at_exit)

``id`` names what is waited on, in the words the rest of the trace uses (a pid, a queue id as
in ``queue.put``, a lock id as in ``lock.wait``), so that a wait-for graph can follow the arrow
from a waiter to whoever must act. A ``wait.begin`` with no end is a thread still waiting when
the trace ended: in a hang, that is the picture. Two events per wait (a get's ends at its read's
``queue.get``: get_wait); waits inside waits are recorded once (:func:`_outermost`). A user's
``Lock`` records its waits in locks.py; a Manager's proxy: _proxy_call; ev.set(): _event_set.
"""
import functools
import os
import sys
import threading
import time
from concurrent import futures
from concurrent.futures import _base
from concurrent.futures import process as futures_process
from concurrent.futures import thread as futures_thread
from multiprocessing import managers, pool, process, queues, synchronize, util

from . import recorder
from .events import queue_id as _queue_id
from .events import semlock_id

_orig = {}                            # what hooks.install replaced, to put back


class _InWait(threading.local):
    """Per thread: whether it is inside a recorded wait. The defaults are class attributes, so
    that asking a thread that never waited finds None at once: with a plain threading.local, that
    getattr raises (and catches) an AttributeError inside -- ~1.7 µs a get in a ping-pong, where
    queue_hooks.c asks at every get that waits."""
    on = None       # set while this thread is inside a recorded wait: what it waits on
    get = None      # the queue id of its get's wait, until that get's queue.get (get_wait)


_in_wait = _InWait()


def _returned(result):
    return True                             # the wait ended as it should unless it raised


def _recorded(call, on, target, more, args, kwargs, judge=_returned):
    """Run `call(*args, **kwargs)` between a ``wait.begin`` and a ``wait.end``, whose ``ok`` is
    ``judge(result)``: False for a wait that gave up (a timeout). (The Writer is called
    directly, as on the recorder's other hot paths: see recorder.py.)"""
    w = recorder.writer
    begin = {"on": on, "id": target}
    if more:
        begin.update(more)
    w.emit("wait.begin", begin)
    _in_wait.on = on
    try:
        result = call(*args, **kwargs)
    except BaseException as exc:
        _in_wait.on = None
        w = recorder.writer
        if w is not None:
            w.emit("wait.end", {"on": on, "id": target, "ok": False,
                                "error": type(exc).__name__})
        raise
    _in_wait.on = None
    w = recorder.writer                     # (recording may have stopped meanwhile)
    if w is not None:
        w.emit("wait.end", {"on": on, "id": target, "ok": judge(result)})
    return result


def get_wait(call, q, args, timeout):
    """A Queue's get that has nothing to read yet: `call(*args)` between a ``wait.begin`` and
    the ``queue.get`` of its read, which ends the wait: that event is recorded anyway, so a get
    that waits costs one event more, not two, and the reader writes the ``wait.end`` back in at
    the queue.get's time (reader.py, ``_Waits``: the pictures get the events they always got).
    Should the get end without that event -- a timeout ran out (``Empty``), it raised before its
    read, or its message came with no event -- it records ``wait.end`` itself, as ``_recorded``
    does; a process killed inside the get leaves its ``wait.begin`` open: drawn as waiting.
    (messages.py asks first whether the get would wait: ``get_would_wait``; queue_hooks.c's
    ``record_get_wait`` is this in C.)"""
    w, qid = recorder.writer, _queue_id(q)
    begin = {"on": "queue.get", "id": qid}
    if timeout is not None:
        begin["timeout"] = timeout
    w.emit("wait.begin", begin)
    _in_wait.on, _in_wait.get = "queue.get", qid     # got() clears .get at the queue.get
    try:
        result = call(*args)
    except BaseException as exc:
        _in_wait.on = None
        if _still_open(qid):
            w = recorder.writer
            if w is not None:
                w.emit("wait.end", {"on": "queue.get", "id": qid, "ok": False,
                                    "error": type(exc).__name__})
        raise
    _in_wait.on = None
    if _still_open(qid):                             # no queue.get: end it here
        w = recorder.writer
        if w is not None:
            w.emit("wait.end", {"on": "queue.get", "id": qid, "ok": True})
    return result


def _still_open(qid):
    """Whether this thread's get's wait on `qid` is still open (no queue.get ended it); it is
    closed now either way."""
    still, _in_wait.get = _in_wait.get == qid, None     # (None by default: _InWait)
    return still


def got(qid):
    """This thread has just recorded a ``queue.get`` on `qid`: if its get's wait on `qid` is
    open, that event ended it (see get_wait). (messages.py calls this after each queue.get it
    records while the Python Writer records; where the C Writer records, queue_hooks.c's Tap
    does the same in C, and messages.install_native puts the C ``got`` in messages.got.)"""
    if _in_wait.get == qid:
        _in_wait.get = None


def _timeout(timeout):
    """The args a wait's timeout adds to its begin: none for the usual wait for ever."""
    return None if timeout is None else {"timeout": timeout}


def _outermost():
    """True if recording and this thread is not already inside a recorded wait.

    Two events per wait, nothing for a wait that cannot block (a join of a child already reaped).
    Waits inside waits (``Event.wait`` calls ``Condition.wait``; ``pool.map`` calls ``get``) are
    recorded once, the outermost: a thread-local flag says "already waiting". What it costs
    (bench/bench_waits.py, bench/bench_recorder.py): docs/PERFORMANCE.md."""
    return recorder.writer is not None and _in_wait.on is None


_py_outermost = _outermost    # where the C Writer records, messages.install_native puts
                              # queue_hooks.c's in its place: it also sees a get's wait recorded
                              # there (which marks a C thread-local, not _in_wait)


def _lock_id(obj, lock):
    """`obj`'s id: that of the semaphore `lock` under it, computed once."""
    lid = getattr(obj, "_mpviz_wid", None)
    if lid is None:
        lid = obj._mpviz_wid = semlock_id(lock)
    return lid


# --- processes and queues ----------------------------------------------------------------------

def process_join(join, self, timeout=None):
    """``Process.join`` (hooks.py calls this): a wait on the child, unless it is already reaped."""
    popen = self._popen
    if not _outermost() or popen is None or popen.returncode is not None:
        return join(self, timeout)
    return _recorded(join, "process", self.pid, {"name": self.name, "timeout": timeout,
                                                 **_at_exit()},
                     (self, timeout), {}, lambda _: popen.returncode is not None)


def _at_exit():
    """``{"at_exit": True}`` while multiprocessing's exit function runs (``util._exiting``):
    at the end of a child's run, or in a program's atexit -- it joins the children a program
    did not join and each queue's feeder thread; a wait there is a wait at interpreter exit."""
    return {"at_exit": True} if util._exiting else {}


def _joinable_join(self):
    if not _outermost():
        return _inner("JoinableQueue.join")(self)
    return _recorded(_inner("JoinableQueue.join"), "queue.join", _queue_id(self), {},
                     (self,), {})


def queue_wait(call, q, args, timeout, judge=_returned):
    """A Queue's put into a full bounded queue: `call(*args)` as a recorded wait on the queue
    (``on: "queue.put"``; a get that must wait: ``get_wait`` above). messages.py asks first,
    without blocking, whether it would wait (put_would_wait, get_would_wait): a put or get that
    can go on at once never comes here. A timeout that runs out (``Full``, or False from the
    semaphore: `judge`) ends the wait with ok False.

    Why ask first: a Queue's get and put run once per message, the recorder's hot path. The
    question costs a get one ``poll(2)`` and a put a look at its semaphore (messages.py, above
    ``readable``); in C, queue_hooks.c's ``record_get_wait`` records a get's wait. (A get that
    found a message which another reader then took first blocks unrecorded: the watchdog's
    stacks show it.)
    """
    more = {"timeout": timeout} if timeout is not None else {}
    more["maxsize"] = getattr(q, "_maxsize", None)
    return _recorded(call, "queue.put", _queue_id(q), more, args, {}, judge)


def _finalize_join(twr):
    """A process at exit waits for each of its queues' feeder threads to finish writing: when a
    pipe is full and nobody reads it, this is where a child hangs (the join-before-get lesson)."""
    thread = twr()
    if thread is None or not _outermost():
        return _inner("Queue._finalize_join")(twr)
    return _recorded(_inner("Queue._finalize_join"), "thread", thread.native_id,
                     {"name": thread.name, **_at_exit()}, (twr,), {})


# --- synchronisation objects -------------------------------------------------------------------

def _event_wait(self, timeout=None):
    if not _outermost():
        return _inner("Event.wait")(self, timeout)
    return _recorded(_inner("Event.wait"), "event", _lock_id(self, self._flag),
                     _timeout(timeout), (self, timeout), {}, bool)        # False: timed out


def _condition_wait(self, timeout=None):
    if not _outermost():
        return _inner("Condition.wait")(self, timeout)
    return _recorded(_inner("Condition.wait"), "condition", _lock_id(self, self._lock),
                     _timeout(timeout), (self, timeout), {}, bool)


def _barrier_wait(self, timeout=None):
    if not _outermost():
        return _inner("Barrier.wait")(self, timeout)
    return _recorded(_inner("Barrier.wait"), "barrier", _lock_id(self, self._cond._lock),
                     {"parties": self._parties, "timeout": timeout}, (self, timeout), {})


# --- who wakes them: Event.set and clear, Condition.notify -------------------------------------
# A wait on an Event or a Condition ends only when another thread sets or notifies it, so those
# calls are recorded too (rare: one event each), under the id their waits carry. Then a verdict
# can say who must act: "nobody has set Event 1 yet", or "its last notify came before this wait
# began: it woke nobody" (the lost wake-up). Event.set notifies the Event's own Condition: that
# inner notify is not recorded (_signalling). One event each, no wait:
#
#     ev.set(), ev.clear()  event.set / event.clear {id: <as its waits'>}
#     cond.notify[_all]()   condition.notify {id, all, waiting: how many waited then}

class _Signalling(threading.local):
    on = False                         # inside a recorded set/clear: its inner calls are not


_signalling = _Signalling()


def _event_set(self):
    if recorder.writer is not None and not _signalling.on:
        recorder.emit("event.set", id=_lock_id(self, self._flag))
    return _quietly(_inner("Event.set"), self)


def _event_clear(self):
    if recorder.writer is not None and not _signalling.on:
        recorder.emit("event.clear", id=_lock_id(self, self._flag))
    return _quietly(_inner("Event.clear"), self)


def _quietly(call, self):
    """`call(self)` with the notify inside it not recorded (an Event's own Condition)."""
    _signalling.on = True
    try:
        return call(self)
    finally:
        _signalling.on = False


def _condition_notify(self, n=1):
    """(notify_all calls notify with n=sys.maxsize: one event either way)"""
    if recorder.writer is not None and not _signalling.on:
        try:                                   # how many wait now (less those that timed out
            waiting = (self._sleeping_count._semlock._get_value() -     # since the last
                       self._woken_count._semlock._get_value())         # notify: "woken")
        except (AttributeError, NotImplementedError, OSError):
            waiting = None
        recorder.emit("condition.notify", id=_lock_id(self, self._lock),
                      all=n >= sys.maxsize, waiting=waiting)
    return _inner("Condition.notify")(self, n)


# --- Pool results and futures ------------------------------------------------------------------

def _result_wait(key):
    """AsyncResult.get or .wait (MapResult's too): a wait on the Pool job, if not ready yet."""
    def wait(self, timeout=None):
        if not _outermost() or self._event.is_set():
            return _stdlib[key](self, timeout)
        return _recorded(_stdlib[key], "pool.result", self._job, _timeout(timeout),
                         (self, timeout), {}, lambda _: self.ready())   # get raises instead
    wait.__name__ = key.rsplit(".", 1)[1]
    return wait


def _future_result(self, timeout=None):
    if not _outermost() or self._state in (_base.FINISHED, _base.CANCELLED_AND_NOTIFIED):
        return _inner("Future.result")(self, timeout)
    more = _timeout(timeout) or {}
    more.update(_future_task(self))
    return _recorded(_inner("Future.result"), "future", f"future-{id(self):x}",
                     more, (self, timeout), {})


def _futures_wait(fs, timeout=None, return_when=futures.ALL_COMPLETED):
    if not _outermost():
        return _inner("futures.wait")(fs, timeout, return_when)
    fs = list(fs)
    return _recorded(_inner("futures.wait"), "future", f"{len(fs)} futures",
                     {"how": return_when, "timeout": timeout}, (fs, timeout, return_when), {},
                     lambda done_and_not: not done_and_not.not_done or
                     return_when != futures.ALL_COMPLETED)


def _as_completed(fs, timeout=None):
    """as_completed is a generator: each step that blocks is a wait (one pair per step)."""
    gen = _inner("futures.as_completed")(fs, timeout)
    if not recorder.ENABLED:
        yield from gen
        return
    while True:
        if _outermost():
            fut = _recorded(next, "future", "as_completed", {"timeout": timeout},
                            (gen, _DONE), {})
        else:
            fut = next(gen, _DONE)
        if fut is _DONE:
            return
        yield fut


_DONE = object()                              # as_completed has no more futures


# --- executors: which task a future is, and who runs it ----------------------------------------
#
# ``fut.result()`` names the task it waits for (``task``: "task(3)") and, where it is known, who
# runs it: a ThreadPoolExecutor's thread (``runner``, found when the wait begins), or a
# ProcessPoolExecutor's worker (``job``: the worker records ``executor.task`` as it takes that
# work item and as it sends its result back; an idle worker is known by ``executor.worker``).

def _future_task(fut):
    """What a wait on `fut` adds to its begin, where known: ``task`` ("task(3)"), and who
    runs it -- a ProcessPoolExecutor's ``job`` (its workers record ``executor.task``), or a
    ThreadPoolExecutor's thread running it now (``runner``: its OS thread id). Looked up only
    when a result() must wait, so a result that is ready costs nothing more."""
    submitted = getattr(fut, "_mpviz_task", None)
    if submitted is not None:                         # a ProcessPoolExecutor's (_submit)
        job, pending, work_id = submitted
        item = pending.get(work_id)
        return {"job": job, **({"task": _call_words(item.fn, item.args, item.kwargs)}
                               if item is not None else {})}
    run = futures_thread._WorkItem.run.__code__
    for ident, frame in sys._current_frames().items():   # a thread that runs it now
        while frame is not None and frame.f_code is not run:
            frame = frame.f_back
        item = frame.f_locals.get("self") if frame is not None else None
        if item is not None and getattr(item, "future", None) is fut:
            thread = threading._active.get(ident)
            return {"task": _call_words(item.fn, item.args, item.kwargs),
                    **({"runner": thread.native_id} if thread is not None else {})}
    return {}


_PLAIN = (int, float, bool, type(None))


def _call_words(fn, args, kwargs):
    """"task(3)", "load('a.csv', ...)": a call as a reader writes it -- its plain arguments
    (numbers, short strings) shown, any other as "..." (the repr of an array can be megabytes);
    a chunk of ``ex.map(square, ...)``: "a chunk of map(square, ...)"."""
    if isinstance(fn, functools.partial):
        if fn.func is futures_process._process_chunk and fn.args:
            return f"a chunk of map({_func_name(fn.args[0])}, ...)"
        args, kwargs, fn = fn.args + tuple(args), {**fn.keywords, **kwargs}, fn.func

    def word(value):
        if isinstance(value, _PLAIN) or (isinstance(value, str) and len(value) <= 40):
            return repr(value)
        return "..."
    shown = [word(a) for a in args[:4]] + [f"{k}={word(v)}" for k, v in
                                            list(kwargs.items())[:4 - min(len(args), 4)]]
    if len(args) + len(kwargs) > 4:
        shown.append("...")
    return f"{_func_name(fn)}({', '.join(shown)})"


def _func_name(fn):
    """A function's name; a partial's function's; an object's type's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def _submit(self, fn, /, *args, **kwargs):
    """ProcessPoolExecutor.submit: the future learns its work item's id (``job``: the call
    queue's id and the work id, as its worker records it) -- a few attribute reads a task."""
    fut = _inner("ProcessPoolExecutor.submit")(self, fn, *args, **kwargs)
    if recorder.writer is not None:
        pending, work_id = self._pending_work_items, self._queue_count - 1
        item = pending.get(work_id)
        if item is None or item.future is not fut:    # another thread submitted meanwhile
            work_id = next((k for k, w in list(pending.items()) if w.future is fut), None)
        if work_id is not None:
            fut._mpviz_task = (f"{_queue_id(self._call_queue)}/{work_id}", pending, work_id)
    return fut


def _executor_worker(call_queue, *args, **kwargs):
    """A ProcessPoolExecutor's worker process (``_process_worker``): it says it is one
    (``executor.worker``: an idle worker waits for work, it is not stuck), and records
    ``executor.task`` start as it takes each work item from the call queue, and done as it
    sends that item's result back (``_sendback_result``)."""
    qid = _queue_id(call_queue)
    recorder.emit("executor.worker", call_queue=qid)
    take = call_queue.get

    def get(*a, **k):
        item = take(*a, **k)
        if item is not None and recorder.writer is not None:
            recorder.emit("executor.task", phase="start", job=f"{qid}/{item.work_id}",
                          func=_func_name(item.fn))
        return item
    call_queue.get = get
    _executor_queue[0] = qid
    return _inner("futures._process_worker")(call_queue, *args, **kwargs)


_executor_queue = [None]          # in a worker process: the id of its executor's call queue


def _sendback_result(result_queue, work_id, *args, **kwargs):
    """A ProcessPoolExecutor's worker sends a work item's result (or its error) back: that
    task is done (``executor.task``)."""
    if recorder.writer is not None and _executor_queue[0] is not None:
        recorder.emit("executor.task", phase="done", job=f"{_executor_queue[0]}/{work_id}")
    return _inner("futures._sendback_result")(result_queue, work_id, *args, **kwargs)


# --- a Manager's proxies: calls whose reply does not come ---------------------------------------
#
# A Manager keeps its objects in a server process of its own; a program holds proxies, and each
# call is a message to that server and its reply (``BaseProxy._callmethod``). A call whose reply
# has not come within PROXY_GRACE is a wait, recorded in the caller (begun when it was sent):
# the server's thread that runs it waits inside the Manager, where no user code is. The first
# call of each method per thread and proxy is a ``manager.use`` event (who put into a Manager's
# Queue, who may set its Event); the server says which address it serves (``manager.serve``).

PROXY_GRACE = 0.01          # seconds: a reply later than this is a wait (a call that returns at
                            # once takes ~0.1 ms; poll() returns as soon as the reply is there)
# the methods a proxy call can block in, and where their timeout is among the positional args
_PROXY_WAITS = {"get": 1, "put": 2, "join": None, "wait": 0, "wait_for": 1, "acquire": 1}
_used = threading.local()   # per thread: the (token id, method) pairs already told (manager.use)


def _proxy_call(self, methodname, args=(), kwds={}):
    """``BaseProxy._callmethod``: every call to a Manager's object from this process. The first
    of each method per thread and proxy is told (``manager.use``); a call that can block, whose
    reply does not come within PROXY_GRACE, is a recorded wait (see the top)."""
    w = recorder.writer
    if w is None:
        return _inner("BaseProxy._callmethod")(self, methodname, args, kwds)
    token = self._token
    told = getattr(_used, "pairs", None)
    if told is None:
        told = _used.pairs = set()
    if (token.address, token.id, methodname) not in told:      # (ids: per Manager)
        told.add((token.address, token.id, methodname))
        w.emit("manager.use", {"id": token.id, "typeid": token.typeid, "method": methodname,
                               "manager": str(token.address)})
    if methodname not in _PROXY_WAITS or _in_wait.on is not None:
        return _inner("BaseProxy._callmethod")(self, methodname, args, kwds)
    return _proxy_wait(self, token, methodname, args, kwds)


def _proxy_wait(self, token, methodname, args, kwds):
    """The call of ``_callmethod`` (CPython's Lib/multiprocessing/managers.py) for a method
    that can block: sent, then its reply awaited -- a wait when it does not come at once."""
    try:
        conn = self._tls.connection
    except AttributeError:
        self._connect()                               # this thread's first call: a connection
        conn = self._tls.connection
    sent = time.monotonic_ns()
    conn.send((self._id, methodname, args, kwds))
    if _replied(conn):
        kind, result = conn.recv()                    # the reply came: no wait
    else:
        at = _PROXY_WAITS[methodname]
        timeout = kwds.get("timeout", args[at] if at is not None and len(args) > at else None)
        begin = {"on": "proxy", "id": token.id, "manager": str(token.address),
                 "typeid": token.typeid, "method": methodname}
        if isinstance(timeout, (int, float)):
            begin["timeout"] = timeout
        recorder.emit_at(sent, "wait.begin", **begin)
        kind, result = _recorded_rest(conn.recv, "proxy", token.id)
    if kind == "#RETURN":
        return result
    if kind == "#PROXY":                              # (a method registered to return one)
        return _new_proxy(self, *result)
    raise managers.convert_to_error(kind, result)


def _new_proxy(self, exposed, token):
    """A call whose result is another of the Manager's objects: its proxy, made as
    ``_callmethod`` makes it (and the server's extra reference to it dropped)."""
    proxytype = self._manager._registry[token.typeid][-1]
    token.address = self._token.address
    proxy = proxytype(token, self._serializer, manager=self._manager, authkey=self._authkey,
                      exposed=exposed)
    conn = self._Client(token.address, authkey=self._authkey)
    managers.dispatch(conn, None, "decref", (token.id,))
    return proxy


def _replied(conn):
    """Has the reply come within PROXY_GRACE? A ``select.poll`` kept on the connection (its
    own ``poll()`` builds a selector each time: ~3 µs a call, most of what this hook cost)."""
    ask = getattr(conn, "_mpviz_poll", None)
    if ask is None:
        import select
        ask = conn._mpviz_poll = select.poll()
        ask.register(conn.fileno(), select.POLLIN)
    return bool(ask.poll(PROXY_GRACE * 1000))


def _recorded_rest(call, on, target):
    """The rest of a wait whose ``wait.begin`` is already written: `call()`, then its
    ``wait.end`` (ok False for a reply that is an error, or a wait that timed out: a False
    from wait() or acquire())."""
    _in_wait.on = on
    try:
        kind, result = call()
    except BaseException as exc:
        _in_wait.on = None
        recorder.emit("wait.end", on=on, id=target, ok=False, error=type(exc).__name__)
        raise
    _in_wait.on = None
    ok = kind in ("#RETURN", "#PROXY") and result is not False
    recorder.emit("wait.end", on=on, id=target, ok=ok, **(
        {} if ok or kind == "#RETURN" else
        {"error": type(result).__name__ if kind == "#ERROR" else kind}))
    return kind, result


def _serve_forever(self):
    """A Manager's server process (``Server.serve_forever``): it says which address it serves
    (``manager.serve``), so that a proxy's wait names the process that keeps the object; its
    threads are the Manager's own (the verdicts say so: they wait for the program's calls)."""
    recorder.emit("manager.serve", manager=str(self.address))
    return _inner("Server.serve_forever")(self)


# --- the feeder thread's write -----------------------------------------------------------------

def feeder_writes(send_bytes, qid, fd):
    """Wrap a feeder thread's write into the pipe `fd`: record a wait when it may block.

    A Linux pipe is a ring of `size` / page-size slots (16 pages: 64 KiB); a write takes a new
    slot unless it fits in what is left of the last page. So a pipe can be full with fewer than
    64 KiB in it: 10,000 small messages of 24 bytes fill it at 65,280 bytes, messages of 3,000
    bytes at 48,000 (one per page). Counting bytes is not enough; asking whether a slot is free
    is -- ``poll(POLLOUT)`` says exactly that, and a write of at most one page needs at most one
    slot. Before each write (while recording) the feeder asks: a write of at most a page with a
    free slot cannot block; any other is recorded as ``wait.begin {on: "pipe.write"}`` ...
    ``wait.end`` (for a bigger write, also when the bytes already in the pipe plus the write
    and a page per slot it may take do not fit). Asking the pipe, not counting our own writes,
    also sees the bytes other processes put into the same queue: a hang is never unrecorded;
    a write recorded as a wait that did not block is a wait of a few microseconds."""
    import fcntl
    import select
    import termios
    try:
        size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):
        return send_bytes                    # not a Linux pipe: nothing we can ask
    page = os.sysconf("SC_PAGE_SIZE")
    writable = select.poll()
    writable.register(fd, select.POLLOUT)
    answer = bytearray(4)

    def send(buf):
        if not recorder.ENABLED:
            return send_bytes(buf)
        n = len(buf) + 4                     # + the length word
        try:
            slot_free = bool(writable.poll(0))
            if n <= page and slot_free:
                return send_bytes(buf)       # one slot at most, and one is free: cannot block
            if slot_free and n <= size:
                fcntl.ioctl(fd, termios.FIONREAD, answer, True)
                if int.from_bytes(answer, sys.byteorder) + n + page * (n // page + 2) <= size:
                    return send_bytes(buf)   # room for it, with a page to spare per slot
        except OSError:                      # (the write will say what is wrong)
            return send_bytes(buf)
        return _recorded(send_bytes, "pipe.write", qid, {"nbytes": len(buf)}, (buf,), {})
    send._mpviz = True                       # messages._hooked: already wrapped
    return send


def _inner(key):
    """What a wrapper calls: the method it replaced (``_orig``), which may be another wrapper --
    a stepped process pauses in its own ``Event.wait`` first (stepper/patches.py) -- else, once
    ``uninstall`` has emptied ``_orig``, the stdlib's own (a wrapper can outlive the recording:
    a queue's finaliser registered while recording runs at exit)."""
    return _orig.get(key) or _stdlib[key]


_stdlib = {
    "JoinableQueue.join": queues.JoinableQueue.join,
    "Queue._finalize_join": queues.Queue._finalize_join,
    "Event.wait": synchronize.Event.wait,
    "Condition.wait": synchronize.Condition.wait,
    "Barrier.wait": synchronize.Barrier.wait,
    "Event.set": synchronize.Event.set,
    "Event.clear": synchronize.Event.clear,
    "Condition.notify": synchronize.Condition.notify,
    "ApplyResult.get": pool.ApplyResult.get,
    "ApplyResult.wait": pool.ApplyResult.wait,
    "Future.result": _base.Future.result,
    "futures.wait": futures.wait,
    "futures.as_completed": futures.as_completed,
    "ProcessPoolExecutor.submit": futures_process.ProcessPoolExecutor.submit,
    "futures._process_worker": futures_process._process_worker,
    "futures._sendback_result": futures_process._sendback_result,
    "BaseProxy._callmethod": managers.BaseProxy._callmethod,
    "Server.serve_forever": managers.Server.serve_forever,
}

PATCHES = [
    (queues.JoinableQueue, "join", _joinable_join, "JoinableQueue.join"),
    (queues.Queue, "_finalize_join", staticmethod(_finalize_join), "Queue._finalize_join"),
    (synchronize.Event, "wait", _event_wait, "Event.wait"),
    (synchronize.Condition, "wait", _condition_wait, "Condition.wait"),
    (synchronize.Barrier, "wait", _barrier_wait, "Barrier.wait"),
    (synchronize.Event, "set", _event_set, "Event.set"),
    (synchronize.Event, "clear", _event_clear, "Event.clear"),
    (synchronize.Condition, "notify", _condition_notify, "Condition.notify"),
    (pool.ApplyResult, "get", _result_wait("ApplyResult.get"), "ApplyResult.get"),
    (pool.ApplyResult, "wait", _result_wait("ApplyResult.wait"), "ApplyResult.wait"),
    (_base.Future, "result", _future_result, "Future.result"),
    (futures, "wait", _futures_wait, "futures.wait"),
    (futures, "as_completed", _as_completed, "futures.as_completed"),
    (futures_process.ProcessPoolExecutor, "submit", _submit, "ProcessPoolExecutor.submit"),
    (futures_process, "_process_worker", _executor_worker, "futures._process_worker"),
    (futures_process, "_sendback_result", _sendback_result, "futures._sendback_result"),
    (managers.BaseProxy, "_callmethod", _proxy_call, "BaseProxy._callmethod"),
    (managers.Server, "serve_forever", _serve_forever, "Server.serve_forever"),
]
