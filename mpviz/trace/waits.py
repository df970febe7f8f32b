"""Blocking waits: a thread that stops until someone else does something is an event, twice.

A program that hangs is a program in which some thread waits for something that never comes.
To see that in a trace, every wait that can hang records when it starts and when it ends::

    p.join()              wait.begin {on: "process", id: <child pid>, name}   ... wait.end {ok}
    popen.wait()          wait.begin {on: "process", id: <child pid>, name, call: "Popen.wait"}
    q.get(), nothing in q wait.begin {on: "queue.get", id: <queue id>, timeout}  ... its queue.get
    q.put(x), q full      wait.begin {on: "queue.put", id: <queue id>, maxsize, timeout} ... wait.end
    q.join()              wait.begin {on: "queue.join", id: <queue id>}       ... wait.end
    ev.wait()             wait.begin {on: "event", id: <its semaphore>}       ... wait.end {ok}
    cond.wait()           wait.begin {on: "condition", id: <its lock>}        ... wait.end {ok}
    barrier.wait()        wait.begin {on: "barrier", id}                      ... wait.end
    res.get() / pool.map  wait.begin {on: "pool.result", id: <job>}           ... wait.end
    fut.result(), wait(), as_completed()   wait.begin {on: "future", ...}     ... wait.end
    a feeder thread's write into a full pipe   {on: "pipe.write", id: <queue id>, nbytes}
    conn.recv(), recv_bytes(), poll(None) on a learner's Pipe() end, nothing to read yet
                          wait.begin {on: "pipe.recv", id: <its end's id>}     ... its pipe.recv
    conn.send(x) into a learner's Pipe() that may be full
                          wait.begin {on: "pipe.send", id: <its end's id>, nbytes} ... wait.end
    a process at exit, waiting for its queue's feeder to finish writing
                          wait.begin {on: "thread", id: <feeder's OS thread id>, name, at_exit}
    (``at_exit: true`` on a join made by multiprocessing's exit function: see _at_exit)

and who ends the waits on an Event or a Condition, one event each (no wait)::

    ev.set(), ev.clear()  event.set / event.clear {id: <as its waits'>}
    cond.notify[_all]()   condition.notify {id, all, waiting: how many waited then}

``id`` names what is waited on, in the words the rest of the trace uses (a pid, a queue id as
in ``queue.put``, a lock id as in ``lock.wait``), so that a wait-for graph can follow the arrow
from a waiter to whoever must act. A ``wait.begin`` with no end is a thread still waiting when
the trace ended: in a hang, that is the picture. Two events per wait (a get's ends at its read's
``queue.get``: get_wait); waits inside waits are recorded once (:func:`_outermost`). A
multiprocessing ``Lock``/``Semaphore`` made by user code records its waits already (locks.py).
"""
import os
import subprocess
import sys
import threading
from concurrent import futures
from concurrent.futures import _base
from multiprocessing import connection, pool, process, queues, synchronize, util

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
    name = os.path.basename(os.fsdecode(program)) if isinstance(program, (str, bytes)) else None
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
# inner notify is not recorded (_signalling).

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
    return _recorded(_inner("Future.result"), "future", f"future-{id(self):x}",
                     _timeout(timeout), (self, timeout), {})


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
_PASS_THROUGH = ("multiprocessing.context", "mpviz.multiprocessing._pipe",
                 "mpviz.multiprocessing.context")     # Pipe() wrappers: the caller above them


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
        if not module.startswith(_PASS_THROUGH):
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
    "connection.Pipe": connection.Pipe,
    "Connection.recv": connection._ConnectionBase.recv,
    "Connection.recv_bytes": connection._ConnectionBase.recv_bytes,
    "Connection.poll": connection._ConnectionBase.poll,
}

PATCHES = [
    (queues.JoinableQueue, "join", _joinable_join, "JoinableQueue.join"),
    (subprocess.Popen, "wait", _popen_wait, "Popen.wait"),
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
    (connection, "Pipe", _pipe, "connection.Pipe"),
    (connection._ConnectionBase, "recv", _conn_recv, "Connection.recv"),
    (connection._ConnectionBase, "recv_bytes", _conn_recv_bytes, "Connection.recv_bytes"),
    (connection._ConnectionBase, "poll", _conn_poll, "Connection.poll"),
]
