"""Blocking waits: a thread that stops until someone else does something is an event, twice.

A program that hangs is a program in which some thread waits for something that never comes.
So every wait that can hang records when it starts and when it ends (``wait.end``)::

    p.join(), popen.wait()  wait.begin {on: "process", id: <child pid>, name, call}
    q.get(), nothing in q   {on: "queue.get", id: <queue id>, timeout}  ... ends at its queue.get
    q.put(x), q full        {on: "queue.put", id: <queue id>, maxsize, timeout}
    q.join()                {on: "queue.join", id: <queue id>}
    ev.wait(), cond.wait()  {on: "event" / "condition", id: <its semaphore / its lock>}
    barrier.wait()          {on: "barrier", id}
    res.get() / pool.map    {on: "pool.result", id: <job>}
    fut.result(), wait(), as_completed()   {on: "future", task, job or runner: _future_task;
                                           several: pending, futures: [_future_task ...]}
    a feeder's write into a full pipe      {on: "pipe.write", id: <queue id>, nbytes}
    conn.recv() on a learner's Pipe(), nothing to read   {on: "pipe.recv", id: <its end>}
    conn.send(x) into a learner's Pipe() that may be full  {on: "pipe.send", id, nbytes}
    at exit, a queue's feeder joined       {on: "thread", id: <its OS thread id>, at_exit}

``id`` names what is waited on in the words the rest of the trace uses (a pid, a queue id as in
``queue.put``, a lock id as in ``lock.wait``), so that a wait-for graph can follow the arrow from
a waiter to whoever must act. A ``wait.begin`` with no end is a thread still waiting when the
trace ended: in a hang, that is the picture. Waits inside waits are recorded once
(:func:`_outermost`). A user's ``Lock``: locks.py; a Manager's proxy: _proxy_call; who sets an
Event or notifies a Condition: _event_set.
"""
import functools
import os
import queue
import subprocess
import sys
import threading
import weakref
import time
from concurrent import futures
from concurrent.futures import _base
from concurrent.futures import process as futures_process
from concurrent.futures import thread as futures_thread
from multiprocessing import connection, managers, pool, process, queues, synchronize, util

from . import locks, names, osview, recorder
from .events import queue_id as _queue_id
from .events import semlock_id

_orig = {}                            # what hooks.install replaced, to put back


class _InWait(threading.local):
    """Per thread: whether it is inside a recorded wait. The defaults are class attributes, so
    that asking a thread that never waited finds None at once: with a plain threading.local, that
    getattr raises (and catches) an AttributeError inside -- ~1.7 µs a get in a ping-pong, where
    queue_hooks.c asks at every get that waits."""
    on = None       # set while this thread is inside a recorded wait: what it waits on
    get = None      # the queue id of its get's wait, until that get's queue.get (get_wait);
                    # a Pipe end's id while its recv's wait is open, until its pipe.recv


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
    begin = {"on": "queue.get", "id": _queue_id(q)}
    if timeout is not None:
        begin["timeout"] = timeout
    return _until_read(call, args, begin)


def _until_read(call, args, begin):
    """`call(*args)` after the ``wait.begin`` `begin`, which the event of the read it makes
    ends (got() or received() clear ``_in_wait.get`` there; reader.py writes the wait.end);
    a call that ends without that event records its ``wait.end`` itself (get_wait)."""
    on, wid = begin["on"], begin["id"]
    recorder.writer.emit("wait.begin", begin)
    _in_wait.on, _in_wait.get = on, wid              # got() clears .get at the queue.get
    try:
        result = call(*args)
    except BaseException as exc:
        _in_wait.on = None
        if _still_open(wid):
            w = recorder.writer
            if w is not None:
                w.emit("wait.end", {"on": on, "id": wid, "ok": False,
                                    "error": type(exc).__name__})
        raise
    _in_wait.on = None
    if _still_open(wid):                             # no read's event: end it here
        w = recorder.writer
        if w is not None:
            w.emit("wait.end", {"on": on, "id": wid, "ok": True})
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


def _popen_wait(self, timeout=None):
    """``subprocess.Popen.wait``: a wait on the child, as a join is (its stdout a full pipe
    nobody reads: the subprocess docs' own deadlock, which stuck.py names)."""
    if not _outermost() or self.returncode is not None:
        return _inner("Popen.wait")(self, timeout)
    program = self.args[0] if isinstance(self.args, (list, tuple)) and self.args else self.args
    try:                                       # (a str, bytes or a pathlib.Path)
        name = os.path.basename(os.fsdecode(program))
    except TypeError:
        name = None
    return _recorded(_inner("Popen.wait"), "process", self.pid,
                     {"name": name, "call": "Popen.wait", "timeout": timeout},
                     (self, timeout), {}, lambda _: self.returncode is not None)


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


def _thread_join(self, timeout=None):
    """``Thread.join()`` with no time limit, of a thread still running, called from the
    program's own code: a recorded wait (``{on: "thread", id: its OS thread id, name}``), so
    that a verdict says who the joiner waits for. The libraries' own joins (a Pool's, an
    executor's at shutdown) are theirs to tell, as a Pipe() they make is (_MAKERS)."""
    call = _inner("Thread.join")
    if timeout is not None or not _outermost() or self.native_id is None or \
            not self.is_alive() or self is threading.current_thread() or \
            sys._getframe(1).f_globals.get("__name__", "").startswith(_JOINERS):
        return call(self, timeout)
    return _recorded(call, "thread", self.native_id, {"name": self.name}, (self, timeout), {})


# --- the threads' own queue.Queue --------------------------------------------------------------
# A program's threads hand work to each other through the stdlib's queue.Queue (not
# multiprocessing's). Called from the program's own code (not a library's: _JOINERS):
#
#     q.get() on an empty one, no time limit   wait.begin {on: "thread_queue.get", id: tq-<pid>-<n>}
#     q.put(x) on a full bounded one           {on: "thread_queue.put", id, maxsize}
#     q.join() with tasks not task_done()      {on: "thread_queue.join", id, unfinished}
#     a thread's first put() / get() on each   thread_queue.put / thread_queue.get {id}
#
# one event each: who puts and who gets is who must act ("Thread-1 must put -- it waits to join
# ..."); the items themselves stay in the process and are not recorded.

_tq_count = [0]
_tq_gen = [0]                       # one more in each forked child: its first puts are its own
_PROGRAMS = {}                      # a caller's code object -> its frame is the program's?
_NOWAIT = ("put_nowait", "get_nowait")    # (queue's own: their caller is the one that counts)
_UNSEEN = object()
_QUEUE_PUT, _QUEUE_GET = queue.Queue.put, queue.Queue.get
os.register_at_fork(after_in_child=lambda: _tq_gen.__setitem__(0, _tq_gen[0] + 1))


def tqueue_id(q):
    """`q`'s id in the trace: ``tq-<pid that first used it>-<n>``, kept on the queue with the
    callers it has seen (``_mpviz_callers``: (fork generation, thread, code, 0 for a put or 1
    for a get) -> its id, or None for a library's call); None for a queue that cannot keep
    them (__slots__)."""
    tq = getattr(q, "_mpviz_tq", None)
    if tq is None:
        _tq_count[0] += 1
        tq = f"tq-{os.getpid()}-{_tq_count[0]}"
        try:
            q._mpviz_tq, q._mpviz_callers = tq, {}
        except AttributeError:            # (an id per call would name one queue many times)
            return None
        try:
            _tqueues_seen[tq] = q         # (looked at once more as the program exits)
        except TypeError:
            pass
    return tq


_tqueues_seen = weakref.WeakValueDictionary()      # id -> a queue.Queue the program used


def thread_queues_left():
    """As the traced program exits (its atexit, after the threads that are not daemons have
    been joined): each queue.Queue of the program's own still alive and holding items records
    ``thread_queue.left {id, items}`` -- a daemon thread that would have got them
    is stopped with the interpreter, mid-queue, and nothing is raised (analysis.lost_work)."""
    if recorder.writer is None:
        return
    for tq, q in list(_tqueues_seen.items()):
        try:
            if not tq.startswith(f"tq-{os.getpid()}-"):
                continue                  # (a forked child's copy: its parent's queue)
            items = q.qsize()
            if items > 0:
                recorder.emit("thread_queue.left", id=tq, items=items)
        except Exception:
            continue


def _programs_code(f):
    """Whether frame `f` runs the program's own code: no library's by its module's name
    (_JOINERS, mpviz's own included) nor by its file's place (the stdlib's directories, an
    installed package's: a Jupyter kernel's own queues are not the program's)."""
    code = f.f_code
    mine = _PROGRAMS.get(code)
    if mine is None:
        mine = _PROGRAMS[code] = \
            not f.f_globals.get("__name__", "").startswith(_JOINERS) and \
            not locks.in_library(code.co_filename)
    return mine


def _first_call(q, key, f, kind):
    """A caller `key` the queue has not seen yet, in frame `f`: the queue's id if it is the
    program's own code (of put_nowait(), get_nowait(): their caller), else None -- kept, and
    this thread's first `kind` on it recorded."""
    if f.f_code.co_name in _NOWAIT and f.f_globals.get("__name__") == "queue":
        f = f.f_back
    tq = tqueue_id(q) if _programs_code(f) else None
    if tq is not None:
        callers = q._mpviz_callers
        if (key[0], key[1], kind) not in callers:        # (its first, from any line)
            callers[key[0], key[1], kind] = tq
            recorder.emit(kind, id=tq)
        callers[key] = tq
    elif getattr(q, "_mpviz_tq", None) is not None:
        q._mpviz_callers[key] = None
    return tq


def _tqueue_put(self, item, block=True, timeout=None):
    """``queue.Queue.put()``: a look at who calls (each caller once), and a recorded wait when
    a bounded queue is full (the program's own put, with no time limit)."""
    call = _orig.get("queue.Queue.put") or _QUEUE_PUT          # (_inner's, one call less)
    if recorder.writer is None:
        return call(self, item, block, timeout)
    f = sys._getframe(1)
    key = (_tq_gen[0], threading.get_ident(), f.f_code, 0)
    tq = getattr(self, "_mpviz_callers", {}).get(key, _UNSEEN)
    if tq is _UNSEEN:
        tq = _first_call(self, key, f, "thread_queue.put")
    if tq is None or not block or timeout is not None or not 0 < self.maxsize <= self._qsize() \
            or not _outermost():
        return call(self, item, block, timeout)
    return _recorded(call, "thread_queue.put", tq, {"maxsize": self.maxsize},
                     (self, item, block, timeout), {})


def _tqueue_get(self, block=True, timeout=None):
    """``queue.Queue.get()``: a recorded wait when it is empty (an unlocked look: a put that
    comes at once makes it a short wait), the program's own, with no time limit."""
    call = _orig.get("queue.Queue.get") or _QUEUE_GET          # (_inner's, one call less)
    if recorder.writer is None:
        return call(self, block, timeout)
    f = sys._getframe(1)
    key = (_tq_gen[0], threading.get_ident(), f.f_code, 1)
    tq = getattr(self, "_mpviz_callers", {}).get(key, _UNSEEN)
    if tq is _UNSEEN:
        tq = _first_call(self, key, f, "thread_queue.get")
    if tq is None or not block or timeout is not None or self._qsize() or not _outermost():
        return call(self, block, timeout)
    return _recorded(call, "thread_queue.get", tq, None, (self, block, timeout), {})


def _tqueue_join(self):
    call = _inner("queue.Queue.join")
    if recorder.writer is None or not self.unfinished_tasks or not _outermost() or \
            not _programs_code(sys._getframe(1)):
        return call(self)
    tq = tqueue_id(self)
    if tq is None:
        return call(self)
    return _recorded(call, "thread_queue.join", tq, {"unfinished": self.unfinished_tasks},
                     (self,), {})


# --- synchronisation objects -------------------------------------------------------------------

def _event_wait(self, timeout=None):
    if not _outermost():
        return _inner("Event.wait")(self, timeout)
    return _recorded(_inner("Event.wait"), "event", _lock_id(self, self._flag),
                     _timeout(timeout), (self, timeout), {}, bool)        # False: timed out


def signal_id(obj):
    """The id an Event's or a Condition's waits have (for a Process given one: hooks.py)."""
    return _lock_id(obj, obj._flag if hasattr(obj, "_flag") else obj._lock)


def _condition_wait(self, timeout=None):
    if not _outermost():
        return _inner("Condition.wait")(self, timeout)
    more = _timeout(timeout)
    if sys._getframe(1).f_code.co_name == "wait_for":  # (it checked its predicate first)
        more = dict(more or {}, via="wait_for")
    return _recorded(_inner("Condition.wait"), "condition", _lock_id(self, self._lock),
                     more, (self, timeout), {}, bool)


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
    """AsyncResult.get or .wait (MapResult's too): a wait on the Pool job, if not ready yet.
    A get() that raises the task's exception records that the program saw it
    (``task.error_seen``: analysis.lost_work names only the errors nobody saw)."""
    def wait(self, timeout=None):
        try:
            if not _outermost() or self._event.is_set():
                return _stdlib[key](self, timeout)
            return _recorded(_stdlib[key], "pool.result", self._job, _timeout(timeout),
                             (self, timeout), {}, lambda _: self.ready())  # get raises instead
        except Exception:
            if key == "ApplyResult.get" and self._event.is_set():
                _error_seen(self._job, "get")
            raise
    wait.__name__ = key.rsplit(".", 1)[1]
    return wait


def _error_seen(job, how):
    """``task.error_seen``: the program got a Pool job's or a future's exception (`how`:
    get/next/result/exception) -- it is not lost work -- or gave the job an error_callback
    (`how` "error_callback", recorded as it is submitted, failing or not: the callback gets
    the error if one comes). Nothing on a good result's way."""
    if recorder.writer is not None:
        recorder.emit("task.error_seen", job=job, how=how)


def _imap_next(key):
    """IMapIterator.next / __next__ (imap, imap_unordered): raising a task's exception is the
    program seeing it."""
    def next_(self, timeout=None):
        try:
            return _inner(key)(self, timeout)
        except StopIteration:
            raise
        except Exception as exc:
            if not isinstance(exc, pool.TimeoutError):
                _error_seen(self._job, "next")
            raise
    next_.__name__ = key.rsplit(".", 1)[1]
    return next_


def _apply_async(self, func, args=(), kwds={}, callback=None, error_callback=None):
    """Pool.apply_async: a job with an error_callback has its error seen, if it fails."""
    res = _inner("Pool.apply_async")(self, func, args, kwds, callback, error_callback)
    res._mpviz_func = getattr(func, "__qualname__", None)   # (named if the job is dropped)
    if error_callback is not None:
        _error_seen(res._job, "error_callback")
    return res


def _map_async(self, func, iterable, mapper, chunksize=None, callback=None,
               error_callback=None):
    """Pool._map_async (map_async, starmap_async): the same."""
    res = _inner("Pool._map_async")(self, func, iterable, mapper, chunksize, callback,
                                    error_callback)
    res._mpviz_func = getattr(func, "__qualname__", None)
    if error_callback is not None:
        _error_seen(res._job, "error_callback")
    return res


def _terminate_pool(cls, *args, **kwargs):
    """Pool._terminate_pool, which terminate(), a ``with Pool(...)`` block's end, the Pool's
    garbage collection and the interpreter's exit all run: the jobs still unfinished then are
    dropped -- their workers are killed, and a get() of their results waits for ever.
    ``pool.terminate`` names them (its ``cache``, the Pool's unfinished results), how it came
    (`how`: with / terminate() / garbage collected / at exit) and the program's line."""
    cache = kwargs.get("cache", args[-1] if args else None)
    if recorder.writer is not None and cache:
        try:
            _pool_terminated(cache, issubclass(cls, pool.ThreadPool))
        except Exception:          # (a recorder never breaks the program's own call)
            pass
    return _inner("Pool._terminate_pool").__get__(None, cls)(*args, **kwargs)


_POOL_ENDS = {pool.Pool.__exit__.__code__: "with", pool.Pool.terminate.__code__: "terminate()",
              util._exit_function.__code__: "at exit"}


def _program_line(frame):
    """"<module> (prog.py:12): `with Pool(4) as pool:`" if `frame` runs the program's own code
    (names.line_words, as stuck.own_line says a line), else None -- with no import: a hook on
    the program's way must not delay it."""
    code = frame.f_code
    if not _programs_code(frame) or code.co_filename.startswith("<"):
        return None
    return names.line_words(code.co_name, code.co_filename, frame.f_lineno)


_empty_said = set()        # (pid, id(queue), code, line): the empty() calls recorded already


def _queue_empty(self):
    """Queue.empty: the first True each line of the program's own gets from a queue is
    recorded (``queue.empty``, once per line: a polling loop asks it thousands of times). A
    loop on ``while not q.empty(): q.get()`` ends the moment the queue is empty -- before the
    other processes have put the rest: the messages left there are lost work
    (analysis.lost_work names this line)."""
    empty = _inner("Queue.empty")(self)
    if empty and recorder.writer is not None:
        try:
            frame = sys._getframe(1)
            key = (os.getpid(), id(self), frame.f_code, frame.f_lineno)
            if key not in _empty_said:
                _empty_said.add(key)
                at = _program_line(frame)
                if at is not None:
                    recorder.emit("queue.empty", queue=_queue_id(self), at=at)
        except Exception:          # (a recorder never breaks the program's own call)
            pass
    return empty


def _job_tasks(result):
    """How many tasks a Pool job has in all -- its chunks, for a map (the task handler may have
    handed out only some when terminate() stopped it) -- or None where not yet known (imap)."""
    if isinstance(result, pool.MapResult):
        value = getattr(result, "_value", None)      # (a list of `length` results to come)
        chunk = getattr(result, "_chunksize", 0)
        return -(-len(value) // chunk) if isinstance(value, list) and chunk > 0 else None
    if isinstance(result, pool.IMapIterator):
        return getattr(result, "_length", None)
    return 1


def _pool_terminated(cache, threads):
    """Cheap, as it runs on the program's way into terminate(): it must not delay it (a
    terminate() late by half a second lets the workers finish the job it drops -- the
    program's own race, tipped by the observer). No import, one file line read."""
    hows, at, frame = set(), None, sys._getframe(2)
    while frame is not None:
        hows.add(_POOL_ENDS.get(frame.f_code))
        if at is None:                                     # the innermost line of its own
            at = _program_line(frame)
        frame = frame.f_back
    how = next((h for h in ("with", "terminate()", "at exit") if h in hows), "garbage collected")
    jobs = sorted(cache)
    tasks = {str(job): _job_tasks(cache[job]) for job in jobs}
    funcs = {str(job): getattr(cache[job], "_mpviz_func", None) for job in jobs}
    recorder.emit("pool.terminate", jobs=jobs, tasks=tasks, funcs=funcs, how=how, at=at,
                  **({"threads": True} if threads else {}))


def _future_job(fut):
    """A ProcessPoolExecutor future's job ("queue id/work id", as its worker records it)."""
    submitted = getattr(fut, "_mpviz_task", None)
    return submitted[0] if submitted is not None else None


def _future_result(self, timeout=None):
    try:
        if not _outermost() or self._state in (_base.FINISHED, _base.CANCELLED_AND_NOTIFIED):
            return _inner("Future.result")(self, timeout)
        more = _timeout(timeout) or {}
        try:
            more.update(_future_task(self))
        except Exception:    # (what the stdlib's internals look like: a recorder never breaks
            pass             # the program's own call -- 3.14 changed _WorkItem's fields)
        return _recorded(_inner("Future.result"), "future", f"future-{id(self):x}",
                         more, (self, timeout), {})
    except Exception:
        if self._state == _base.FINISHED and _future_job(self) is not None:
            _error_seen(_future_job(self), "result")    # (the task's own exception)
        raise


def _future_exception(self, timeout=None):
    """Future.exception: a task's exception returned is one the program saw."""
    exc = _inner("Future.exception")(self, timeout)
    if exc is not None and _future_job(self) is not None:
        _error_seen(_future_job(self), "exception")
    return exc


def _futures_wait(fs, timeout=None, return_when=futures.ALL_COMPLETED):
    fs = list(fs)
    if not _outermost() or all(f.done() for f in fs) or (
            return_when == futures.FIRST_COMPLETED and any(f.done() for f in fs)):
        return _inner("futures.wait")(fs, timeout, return_when)
    return _recorded(_inner("futures.wait"), "future", f"{len(fs)} futures",
                     {"how": return_when, "timeout": timeout, **_pending_tasks(fs)},
                     (fs, timeout, return_when), {},
                     lambda done_and_not: not done_and_not.not_done or
                     return_when != futures.ALL_COMPLETED)


def _as_completed(fs, timeout=None):
    """as_completed is a generator: each step that blocks is a wait (one pair per step); a
    step with a finished future not yet handed out does not wait, and records nothing."""
    fs = list(dict.fromkeys(fs))                 # (in the program's order, each once)
    gen = _inner("futures.as_completed")(fs, timeout)
    if not recorder.ENABLED:
        yield from gen
        return
    given = set()
    while True:
        left = [f for f in fs if f not in given]
        if _outermost() and not any(f.done() for f in left):
            fut = _recorded(next, "future", "as_completed",
                            {"timeout": timeout, **_pending_tasks(left)}, (gen, _DONE), {})
        else:
            fut = next(gen, _DONE)
        if fut is _DONE:
            return
        given.add(fut)
        yield fut


_DONE = object()                              # as_completed has no more futures
_MANY = 8                                     # the tasks a wait on many futures names, at most


def _pending_tasks(fs):
    """What a wait on several futures adds to its begin: ``pending`` (how many are not done)
    and ``futures``, the first few of them as ``_future_task`` describes each (its task, and
    its job or runner) -- so that the verdict names the tasks and who runs them."""
    pending = [f for f in fs if not f.done()]
    described = []
    for f in pending[:_MANY]:
        try:
            described.append(_future_task(f))
        except Exception:    # (a recorder never breaks the program's own call)
            described.append({})
    return {"pending": len(pending), "futures": described}


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
    if getattr(fut, "_mpviz_queued", None) is not None and not fut.running():
        return _queued_in_thread_pool(fut)            # (no thread runs it yet)
    for ident, frame in sys._current_frames().items():   # a thread that runs it now
        while frame is not None and frame.f_code is not run:
            frame = frame.f_back
        item = frame.f_locals.get("self") if frame is not None else None
        if item is not None and getattr(item, "future", None) is fut:
            thread = threading._active.get(ident)
            call = _item_call(item)
            return {**({"task": _call_words(*call)} if call else {}),
                    **({"runner": thread.native_id} if thread is not None else {})}
    return {}


def _item_call(item):
    """(fn, args, kwargs) of a ThreadPoolExecutor's work item: its fields up to 3.13; from 3.14
    on, its ``task`` as the default WorkerContext resolves it (another context's: None)."""
    if hasattr(item, "fn"):
        return item.fn, item.args, item.kwargs
    task = getattr(item, "task", None)
    if isinstance(task, tuple) and len(task) == 3 and callable(task[0]):
        return task
    return None


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


def _thread_submit(self, fn, /, *args, **kwargs):
    """ThreadPoolExecutor.submit: the future keeps its call in words and its executor (weakly),
    so that a wait on it before any thread runs it names the task and the executor's threads,
    all busy (``queued``, ``workers``). Words, not the call: a future kept in a list must not
    keep its arguments alive (the work item lets them go once run)."""
    fut = _inner("ThreadPoolExecutor.submit")(self, fn, *args, **kwargs)
    if recorder.writer is not None:
        try:
            fut._mpviz_queued = (_call_words(fn, args, kwargs), weakref.ref(self))
        except Exception:      # (a recorder never breaks the program's own call)
            pass
    return fut


def _queued_in_thread_pool(fut):
    """A ThreadPoolExecutor's future no thread runs yet: its task, and the OS thread ids of the
    executor's threads (``workers``), every one busy with another task -- or {}."""
    task, executor = fut._mpviz_queued
    executor = executor()
    if executor is None or fut.running() or fut.done():
        return {}
    workers = [t.native_id for t in list(getattr(executor, "_threads", ())) if t.is_alive()]
    return {"task": task, "queued": True, "workers": workers}


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
        exc = kwargs.get("exception")             # (the stdlib's _ExceptionWithTraceback)
        exc = getattr(exc, "exc", exc)
        recorder.emit("executor.task", phase="done", job=f"{_executor_queue[0]}/{work_id}",
                      **({"error": f"{type(exc).__name__}: {exc}"[:300]} if exc else {}))
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


# --- a learner's Pipe(): recv with nothing to read, send into a full pipe ---------------------
#
# ``Pipe()`` gives two Connections; each end is a kernel object, the same in every process that
# holds it (fork copies the fd, spawn and forkserver pass it over): its inode names it, so every
# process computes the same id for the same end without asking anyone::
#
#     Pipe()              a socketpair: two sockets, two inodes    ends "conn-81", "conn-82"
#     Pipe(duplex=False)  an os.pipe: one inode, a read and a write end   "conn-83r", "conn-83w"
#
# The Pipe's maker records ``pipe.open {ends: [a, b]}``: which two ends are one Pipe, and who
# made it. The ends are marked (``_mpviz_end``): a marked end's send is recorded on its end's id
# (messages.py), and its recv with nothing to read is a wait on it -- so a verdict can follow the
# arrow from a thread waiting on one end to whoever holds the other (analysis.py). Only the
# program's own Pipes are marked: those multiprocessing, concurrent.futures, torch or mpviz make
# for themselves (a Pool's result pipe, a Manager's) are their own story, told elsewhere.
# A marked end given to a child as a Process argument stays marked there: under fork it is the
# same object; under spawn/forkserver the Process carries the ids of its marked ends
# (``_mpviz_pipe_ends``), and the child marks the rebuilt Connections (mark_given).

_MAKERS = ("multiprocessing.", "concurrent.", "torch.", "mpviz.trace.", "mpviz.sharing.",
           "mpviz.multiprocessing.spawn")
# the libraries whose Thread.join() calls are theirs (_thread_join)
_JOINERS = _MAKERS + ("threading", "queue", "logging", "socketserver", "asyncio", "subprocess",
                      "mpviz.")
# Pipe() wrappers, whose caller is the one that counts: a function named Pipe in the stdlib's
# context or in mpviz's multiprocessing package (its context, its own Pipe)
_PASS_THROUGH = ("multiprocessing.context", "mpviz.multiprocessing")


def end_id(conn):
    """The id of a Connection's end (see above): ``conn-<inode>``, ``r``/``w`` for an os.pipe."""
    import stat
    st = os.fstat(conn.fileno())
    if stat.S_ISFIFO(st.st_mode):
        return f"conn-{st.st_ino}{'r' if conn.readable else 'w'}"
    return f"conn-{st.st_ino}"


def _made_by_the_program():
    """Whether the Pipe() being made is the program's own (the first caller outside the Pipe
    wrappers is not a library's: see _MAKERS)."""
    f = sys._getframe(2)
    while f is not None:
        module = f.f_globals.get("__name__", "")
        if not (module.startswith(_PASS_THROUGH) and f.f_code.co_name == "Pipe"):
            return not module.startswith(_MAKERS)
        f = f.f_back
    return False


def _pipe(duplex=True):
    """``multiprocessing.connection.Pipe``, while recording: the program's own Pipe is marked
    and its ``pipe.open`` recorded (see above)."""
    a, b = _inner("connection.Pipe")(duplex)
    if recorder.ENABLED and _made_by_the_program():
        try:
            ends = [end_id(a), end_id(b)]
        except OSError:
            return a, b
        _mark(a, ends[0])
        _mark(b, ends[1])
        recorder.emit("pipe.open", ends=ends, duplex=bool(duplex))
    return a, b


# A Listener/Client connection is a Pipe of two processes: each side marks its end when it has
# it (``accept()``, ``Client()``, the handshake done) and records ``pipe.open {ends: [its end,
# the other end], connect: "accept" | "Client", address}`` -- the other end named by its inode,
# which Linux tells (osview.peer_socket_inode). Only the program's own: a Manager's and the
# resource sharer's connections are multiprocessing's (_MAKERS).

def _listener_accept(self):
    conn = _inner("Listener.accept")(self)
    if recorder.ENABLED and _made_by_the_program():
        _mark_connected(conn, "accept", self.address)
    return conn


def _client(address, family=None, authkey=None):
    conn = _inner("connection.Client")(address, family, authkey)
    if recorder.ENABLED and _made_by_the_program():
        _mark_connected(conn, "Client", address)
    return conn


def _mark_connected(conn, how, address):
    try:
        mine = end_id(conn)
        peer = osview.peer_socket_inode(conn.fileno())
        here = bool(peer) or osview.same_host_peer(conn.fileno())
    except OSError:
        return
    if not here:                          # (the other end is not on this machine: no pair)
        return
    _mark(conn, mine)
    where = address if isinstance(address, str) else \
        ":".join(str(part) for part in tuple(address)[:2])
    # Its other end is named only if seen now: a TCP end its listener has not accepted yet has
    # inode 0 in /proc/net/tcp, and so has one the listener accepted and closed at once. The
    # accept() side's pipe.open names both ends (names.join_ends joins the two records): the
    # Client is never held up waiting for it.
    recorder.emit("pipe.open", ends=[mine, f"conn-{peer}"] if peer else [mine], duplex=True,
                  connect=how, address=where)


def marked_end(value):
    """The end id of `value` if it is a marked Connection (hooks.py: a Process's arguments)."""
    if isinstance(value, connection._ConnectionBase):
        return value.__dict__.get("_mpviz_end")
    return None


def mark_given(proc, connections):
    """In a spawn/forkserver child, at its start: mark each of `connections` (those among its
    Process arguments) whose end the parent had marked (``proc._mpviz_pipe_ends``)."""
    ends = set(proc.__dict__.get("_mpviz_pipe_ends") or ())
    for conn in connections:
        if ends and "_mpviz_end" not in conn.__dict__:
            try:
                end = end_id(conn)
            except OSError:
                continue
            if end in ends:
                _mark(conn, end)


def _mark(conn, end):
    """Mark `conn` as the program's Pipe end `end`, with the poll(2) object its recv asks
    (_waits): kept on it, as its fd is."""
    import select
    conn._mpviz_end, conn._mpviz_poll = end, select.poll()
    conn._mpviz_poll.register(conn.fileno(), select.POLLIN)


def _waits(conn):
    """`conn`'s end id if its recv would be a recorded wait now, else None: a marked end,
    recording, no wait around it, nothing to read yet (poll(2), timeout 0). (A closed
    Connection: None, and the recv itself says so.) Asked at every recv of every Connection
    while recording: a dict look-up for one the program did not make."""
    d = conn.__dict__
    end = d.get("_mpviz_end")
    if end is None or conn._handle is None or not _outermost() or d["_mpviz_poll"].poll(0):
        return None
    return end


def _conn_recv(self):
    end = _waits(self)
    if end is None:
        return _inner("Connection.recv")(self)
    return _recv_wait(_inner("Connection.recv"), self, end, (), None)


def _conn_recv_bytes(self, maxlength=None):
    end = _waits(self)
    if end is None:
        return _inner("Connection.recv_bytes")(self, maxlength)
    return _recv_wait(_inner("Connection.recv_bytes"), self, end, (maxlength,), "recv_bytes")


def _conn_poll(self, timeout=0.0):
    """``poll(None)``: a wait for ever for something to read, as a recv's (one with a timeout
    ends by itself: not recorded)."""
    end = _waits(self) if timeout is None else None
    if end is None:
        return _inner("Connection.poll")(self, timeout)
    return _recv_wait(_inner("Connection.poll"), self, end, (timeout,), "poll")


def _connection_wait(object_list, timeout=None):
    """``multiprocessing.connection.wait(objects)`` with no time limit, over at least one of the
    program's Pipe ends, none ready yet: a recorded wait, as a recv's on each of those ends
    (``wait.begin {on: "pipe.recv", call: "wait", id: <the first end>, ends: [...]}``): whoever
    holds the other end of any of them must send (or close it, for an EOF). The objects beside
    them (a process's sentinel, a socket) are counted (``others``), not named. One with a
    timeout ends by itself: not recorded, as ``poll(timeout)``."""
    call = _inner("connection.wait")
    if timeout is not None or not _outermost():
        return call(object_list, timeout)
    objects = list(object_list)                  # (an iterator is read once: pass the list on)
    ends = [marked_end(o) for o in objects]
    ends = [e for e in ends if e is not None]
    if not ends:                                 # (the library's own waits: not the program's)
        return call(objects, timeout)
    ready = call(objects, 0)                     # something to read already: no wait
    if ready:
        return ready
    begin = {"on": "pipe.recv", "id": ends[0], "call": "wait"}
    if len(ends) > 1:
        begin["ends"] = ends
    if len(objects) > len(ends):
        begin["others"] = len(objects) - len(ends)
    return _until_read(call, (objects, None), begin)


def _recv_wait(call, conn, end, more, name):
    """`call(conn, *more)` between a ``wait.begin {on: "pipe.recv"}`` and the ``pipe.recv`` of
    the message it reads, which ends the wait (the reader writes its ``wait.end`` back in, as for
    a Queue's get: get_wait); a recv that ends without that event (bytes, an EOFError, an
    unrecorded sender) records its ``wait.end`` itself. `name`: the call, if not recv()."""
    begin = {"on": "pipe.recv", "id": end}
    if name is not None:
        begin["call"] = name
    return _until_read(call, (conn,) + more, begin)


def received():
    """This thread has just recorded a ``pipe.recv`` (messages.py, unpickling an envelope): it
    ends its recv's wait, if one is open (reader.py's _Waits writes that wait.end)."""
    if _in_wait.on == "pipe.recv":
        _in_wait.get = None


def pipe_send(conn, end, data):
    """A marked end's send of the pickled `data` (messages.py): a recorded wait when the write
    may block -- the pipe or socket is full, or would be with `data` in it.

    Asking the kernel at each send would cost a system call per message. Instead the end keeps
    the room it had when last asked (``_mpviz_room``: this process's, as a fork copies it), and
    each send spends from it what it may take at most (_cost); only when that runs out does it
    ask again (_room). The reader only ever makes room, so a send paid for cannot block; one
    that the room asked afresh cannot take is recorded as ``wait.begin {on: "pipe.send"}`` ...
    ``wait.end`` (a wait of microseconds, if the reader was just reading)."""
    n = len(data) + 4                         # + the length word
    cost = _PIPE_COST(n) if end[-1] == "w" else _SOCKET_COST(n)
    left = conn.__dict__.get("_mpviz_room")
    if left is not None and left[0] == recorder.PID and left[1] >= cost:
        conn._mpviz_room = (recorder.PID, left[1] - cost)
        return conn._send_bytes(data)
    try:
        room = _room(conn, end[-1] == "w")
    except OSError:                           # (the write will say what is wrong)
        return conn._send_bytes(data)
    if room >= cost or not _outermost():
        conn._mpviz_room = (recorder.PID, room - cost)
        return conn._send_bytes(data)
    conn._mpviz_room = None
    return _recorded(conn._send_bytes, "pipe.send", end, {"nbytes": len(data)}, (data,), {})


_PAGE = os.sysconf("SC_PAGE_SIZE")
# What a write of n bytes may take at most. A pipe stores writes in page-sized slots: one takes
# at most a new slot per page it holds, and one more. A Unix socket (a duplex Pipe) counts each
# write's buffer with its bookkeeping (the kernel's "truesize"): at most twice n and a KiB.
_PIPE_COST = lambda n: (n // _PAGE + 1) * _PAGE            # noqa: E731
_SOCKET_COST = lambda n: 2 * n + 1024                      # noqa: E731


def _room(conn, pipe):
    """What the end can take now without blocking. A pipe: its size (F_GETPIPE_SZ) less the
    slots its bytes fill (FIONREAD, in pages) and the one the reader is in. A Unix socket: its
    send buffer (SO_SNDBUF) less what it has sent that the other end has not read (SIOCOUTQ): a
    write blocks only once that reaches the buffer."""
    import fcntl
    import termios
    fd, answer = conn.fileno(), bytearray(4)
    size = conn.__dict__.get("_mpviz_size")
    if pipe:
        if size is None:
            size = conn._mpviz_size = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        fcntl.ioctl(fd, termios.FIONREAD, answer, True)
        inside = int.from_bytes(answer, sys.byteorder)
        return size - (-(-inside // _PAGE) + 1) * _PAGE
    if size is None:
        import socket
        with socket.socket(fileno=os.dup(fd)) as s:
            size = conn._mpviz_size = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    fcntl.ioctl(fd, termios.TIOCOUTQ, answer, True)
    return size - int.from_bytes(answer, sys.byteorder)


# a Connection's own recv_bytes, hooked or not (messages._plain_pipe: a Queue's read is plain)
PLAIN_RECV_BYTES = (connection._ConnectionBase.recv_bytes, _conn_recv_bytes)


def _inner(key):
    """What a wrapper calls: the method it replaced (``_orig``), which may be another wrapper --
    a stepped process pauses in its own ``Event.wait`` first (stepper/patches.py) -- else, once
    ``uninstall`` has emptied ``_orig``, the stdlib's own (a wrapper can outlive the recording:
    a queue's finaliser registered while recording runs at exit)."""
    return _orig.get(key) or _stdlib[key]


_stdlib = {
    "JoinableQueue.join": queues.JoinableQueue.join,
    "Popen.wait": subprocess.Popen.wait,
    "Queue._finalize_join": queues.Queue._finalize_join,
    "Queue.empty": queues.Queue.empty,
    "Event.wait": synchronize.Event.wait,
    "Condition.wait": synchronize.Condition.wait,
    "Barrier.wait": synchronize.Barrier.wait,
    "Event.set": synchronize.Event.set,
    "Event.clear": synchronize.Event.clear,
    "Condition.notify": synchronize.Condition.notify,
    "ApplyResult.get": pool.ApplyResult.get,
    "ApplyResult.wait": pool.ApplyResult.wait,
    "Future.result": _base.Future.result,
    "Future.exception": _base.Future.exception,
    "IMapIterator.next": pool.IMapIterator.next,
    "IMapIterator.__next__": pool.IMapIterator.__next__,
    "Pool.apply_async": pool.Pool.apply_async,
    "Pool._map_async": pool.Pool._map_async,
    "Pool._terminate_pool": pool.Pool.__dict__["_terminate_pool"],
    "futures.wait": futures.wait,
    "futures.as_completed": futures.as_completed,
    "connection.Pipe": connection.Pipe,
    "Listener.accept": connection.Listener.accept,
    "connection.Client": connection.Client,
    "Connection.recv": connection._ConnectionBase.recv,
    "Connection.recv_bytes": connection._ConnectionBase.recv_bytes,
    "Connection.poll": connection._ConnectionBase.poll,
    "connection.wait": connection.wait,
    "Thread.join": threading.Thread.join,
    "queue.Queue.put": queue.Queue.put,
    "queue.Queue.get": queue.Queue.get,
    "queue.Queue.join": queue.Queue.join,
    "ProcessPoolExecutor.submit": futures_process.ProcessPoolExecutor.submit,
    "ThreadPoolExecutor.submit": futures_thread.ThreadPoolExecutor.submit,
    "futures._process_worker": futures_process._process_worker,
    "futures._sendback_result": futures_process._sendback_result,
    "BaseProxy._callmethod": managers.BaseProxy._callmethod,
    "Server.serve_forever": managers.Server.serve_forever,
}

PATCHES = [
    (queues.JoinableQueue, "join", _joinable_join, "JoinableQueue.join"),
    (subprocess.Popen, "wait", _popen_wait, "Popen.wait"),
    (queues.Queue, "_finalize_join", staticmethod(_finalize_join), "Queue._finalize_join"),
    (queues.Queue, "empty", _queue_empty, "Queue.empty"),
    (synchronize.Event, "wait", _event_wait, "Event.wait"),
    (synchronize.Condition, "wait", _condition_wait, "Condition.wait"),
    (synchronize.Barrier, "wait", _barrier_wait, "Barrier.wait"),
    (synchronize.Event, "set", _event_set, "Event.set"),
    (synchronize.Event, "clear", _event_clear, "Event.clear"),
    (synchronize.Condition, "notify", _condition_notify, "Condition.notify"),
    (pool.ApplyResult, "get", _result_wait("ApplyResult.get"), "ApplyResult.get"),
    (pool.ApplyResult, "wait", _result_wait("ApplyResult.wait"), "ApplyResult.wait"),
    (_base.Future, "result", _future_result, "Future.result"),
    (_base.Future, "exception", _future_exception, "Future.exception"),
    (pool.IMapIterator, "next", _imap_next("IMapIterator.next"), "IMapIterator.next"),
    (pool.IMapIterator, "__next__", _imap_next("IMapIterator.__next__"),
     "IMapIterator.__next__"),
    (pool.Pool, "apply_async", _apply_async, "Pool.apply_async"),
    (pool.Pool, "_map_async", _map_async, "Pool._map_async"),
    (pool.Pool, "_terminate_pool", classmethod(_terminate_pool), "Pool._terminate_pool"),
    (futures, "wait", _futures_wait, "futures.wait"),
    (futures, "as_completed", _as_completed, "futures.as_completed"),
    (connection, "Pipe", _pipe, "connection.Pipe"),
    (connection.Listener, "accept", _listener_accept, "Listener.accept"),
    (connection, "Client", _client, "connection.Client"),
    (connection._ConnectionBase, "recv", _conn_recv, "Connection.recv"),
    (connection._ConnectionBase, "recv_bytes", _conn_recv_bytes, "Connection.recv_bytes"),
    (connection._ConnectionBase, "poll", _conn_poll, "Connection.poll"),
    (connection, "wait", _connection_wait, "connection.wait"),
    (threading.Thread, "join", _thread_join, "Thread.join"),
    (queue.Queue, "put", _tqueue_put, "queue.Queue.put"),
    (queue.Queue, "get", _tqueue_get, "queue.Queue.get"),
    (queue.Queue, "join", _tqueue_join, "queue.Queue.join"),
    (futures_process.ProcessPoolExecutor, "submit", _submit, "ProcessPoolExecutor.submit"),
    (futures_thread.ThreadPoolExecutor, "submit", _thread_submit, "ThreadPoolExecutor.submit"),
    (futures_process, "_process_worker", _executor_worker, "futures._process_worker"),
    (futures_process, "_sendback_result", _sendback_result, "futures._sendback_result"),
    (managers.BaseProxy, "_callmethod", _proxy_call, "BaseProxy._callmethod"),
    (managers.Server, "serve_forever", _serve_forever, "Server.serve_forever"),
]
