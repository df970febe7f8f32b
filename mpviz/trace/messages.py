"""Linking a put to its get across processes: by pipe order for Queues, envelopes elsewhere.

A queue moves *bytes*; nothing in them says which put they came from. But a ``Queue``'s pipe is
first in, first out, and every write into it happens under the queue's write lock, every read
under its read lock. So the n-th message written is the n-th message read -- the events only have
to say *when* each write and each read happened, inside those locks::

    producer (pid 7)                                     consumer (pid 9)
    q.put(obj) ─► emit queue.put(msg=7.3)                 q.get():
                  buffer ◄─ _Tag(obj, "7.3")                 read the bytes (read lock held)
    feeder thread:                                           emit queue.get(nbytes, sig)
      pickle(obj) — just obj: the tag is not sent            unpickle, return obj
      (write lock held:) emit queue.feed(msg=7.3, nbytes, sig)    ▲
        write  ──────────────────────────────► pipe ──────────────┘
    Trace: per queue, writes (feeds) and reads (gets) in time order, zipped: get.msg = "7.3"

``sig`` (Adler-32 of a message's last 32 bytes) and ``nbytes`` check each pair (link_by_order);
nothing is added to the bytes that travel. Wrapped: the stdlib's classes, code we cannot edit
(``PATCHES``); mpviz's own Queue records itself, with the helpers at the end of this module.

**Envelopes** (``SimpleQueue``, ``Pipe``, Queues whose feeder started before recording) carry the
id in the message: unpickling ``_Envelope(obj, "7.3")`` calls ``_open``, which emits queue.get and
returns obj. Per-message hooks: here (the reference) and in queue_hooks.c. Next: recorder.py.

Adapted from distributed tracing's context propagation; Queues: MPI traces' FIFO send/recv matching.
"""
import bisect
import itertools
import os
import select
import sys
import threading

from multiprocessing import connection, pool, queues
from multiprocessing.reduction import ForkingPickler

from .. import _stops
from . import recorder, waits
from .events import order as _order
from .events import queue_id as _queue_id  # noqa: F401  (queue_hooks.c looks it up here)


def _start_numbering():
    global _counter, _prefix
    _counter, _prefix = itertools.count(1), f"{os.getpid()}."
    if _c_numbering is not None:             # queue_hooks.c's put keeps them too
        _c_numbering(_counter, _prefix)


_c_numbering = None                          # queue_hooks.c's set_numbering, once in use


_start_numbering()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_start_numbering)   # a forked child numbers its own


def next_msg():
    """A new message id, ``"<pid>.<n>"``: unique in a trace. (Once per recorded message: one
    string concatenation, no check of the pid.)"""
    return _prefix + str(next(_counter))


# --- the envelope ----------------------------------------------------------------------------

class _Envelope:
    """Wraps the user's object on its way through a queue or pipe; gone again on arrival.

    It pickles as ``_open(kind, channel, msg, obj)``: the user's object is pickled *inline* by
    the same pickler (no second pickling, no copy), and unpickling calls ``_open``.
    """
    __slots__ = ("obj", "kind", "channel", "msg")

    def __init__(self, obj, kind, channel, msg):
        self.obj, self.kind, self.channel, self.msg = obj, kind, channel, msg

    def __reduce__(self):
        return _open, (self.kind, self.channel, self.msg, self.obj)


_RECEIVE = {"queue": "queue.get", "pipe": "pipe.recv"}
_ENVELOPE_MARK = __name__.encode()   # an envelope's bytes name this module near the start


def _open(kind, channel, msg, obj):
    """Runs in the receiver, while it unpickles: record the get, return the user's object."""
    if recorder.ENABLED:
        recorder.emit(_RECEIVE[kind], **{kind: channel}, msg=msg)
        if kind == "queue":
            got(channel)                     # it ends this get's wait, if it waited (waits.py)
        else:
            waits.received()                 # ... or this recv's (a Pipe's: waits.py)
    return obj


# --- Queues, put and get: patched methods (installed by hooks.py while recording) -----------

_orig = {}
_feeding = threading.local()     # .msg: the id the feeder just pickled, until its write reports it
sig = recorder.sig               # a fingerprint of a message's bytes, to check write/read pairs


class _Tag:
    """A put's object and its message id, in a Queue's buffer; the feeder pickles only `obj`.

    (Should a tag outlive recording, the plain ForkingPickler pickles it as the object.)"""
    __slots__ = ("obj", "msg")

    def __init__(self, obj, msg):
        self.obj, self.msg = obj, msg

    def __reduce__(self):
        return _identity, (self.obj,)


def _identity(obj):
    return obj


_TAG_TYPES = {_Tag}          # and queue_hooks.c's Tag, once the C hooks are used (install_native)
_take_c_msg = None           # then: queue_hooks.c's take_feeding_msg (see _fed)


class _TagPickler(ForkingPickler):
    """Installed as the feeder's pickler (``multiprocessing.queues._ForkingPickler``) while
    recording: a tagged object is pickled alone, and its id waits for the write."""

    @classmethod
    def dumps(cls, obj, protocol=None):
        msg = None
        if type(obj) in _TAG_TYPES:
            obj, msg = obj.obj, obj.msg
        recorder.take_handles()                 # count this message's handles from 0
        try:
            data = ForkingPickler.dumps(obj, protocol)
        except Exception as exc:
            feed_failed(msg, exc)
            raise
        _feeding.msg = msg                      # (once pickled: a failed dump writes nothing)
        _feeding.handles = recorder.take_handles()
        return data


class _CountingPickler(ForkingPickler):
    """What queue_hooks.c's Pickler pickles with: ForkingPickler, and how many handles the
    message carried, left in a C thread-local (``set_feeding_handles``) for the Tap that records
    the write of those bytes: its ``queue.feed`` says ``handles=N``, as the Python Tap's does.
    (Until 2026-11-28 a ``queue.handles`` event of its own, one more event a message: readers
    still give an old trace's to the next ``queue.feed`` of the same thread.)"""

    @classmethod
    def dumps(cls, obj, protocol=None):
        recorder.take_handles()
        try:
            data = ForkingPickler.dumps(obj, protocol)
        except Exception as exc:
            feed_failed(None, exc)
            raise
        _c_feeding_handles(recorder.take_handles())     # (0 too: none left from before)
        return data


_c_feeding_handles = None    # queue_hooks.c's set_feeding_handles, once the C hooks are used


def feed_failed(msg, exc):
    """A feeder thread could not pickle a message: put() returned long before (it pickles
    nothing), the stdlib drops the message -- and prints nothing at all if the process is
    exiting by then. ``queue.put_failed`` with ``feeder`` (and the message's id, where this
    pickler knows it: not queue_hooks.c's, which unwraps the tag itself) says why it never came.
    Never raises: the feeder's own error goes on."""
    try:
        recorder.emit("queue.put_failed", queue=None, msg=msg, feeder=True,
                      error=f"{type(exc).__name__}: {exc}"[:300])
    except Exception as failed:
        _unrecorded("queue.put_failed", failed)


# The hooks below run once per message, in the threads that move it: whatever they do delays
# the message. So each is one short function that talks to the Writer directly (and all are in
# C too, for the C Writer: see top).

def _tagging_put(stdlib_put):
    """Queue.put or JoinableQueue.put (the stdlib's is ``_orig[stdlib_put]``), which while
    recording tags `obj` -- or puts it in an envelope: see top.

    The put is recorded before the stdlib's put runs, so that a put that blocks (a full
    bounded queue) is seen while it waits. Should it raise instead (``Full``, a closed queue),
    ``queue.put_failed`` says that the message never entered the queue."""
    def put(self, obj, block=True, timeout=None):
        if _stops.pause: _stops.pause("queue.put", _queue_id(self))  # a stepped run: see stepper/
        w = recorder.writer                    # None: not recording
        if w is None:
            return _orig[stdlib_put](self, obj, block, timeout)
        qid, msg = _queue_id(self), next_msg()
        w.emit("queue.put", {"queue": qid, "msg": msg})
        try:
            item = for_feeder(self, obj, qid, msg)
            if block and put_would_wait(self):      # a full bounded queue: a recorded wait
                return waits.queue_wait(_orig[stdlib_put], self, (self, item, block, timeout),
                                        timeout)
            return _orig[stdlib_put](self, item, block, timeout)
        except BaseException as exc:
            put_failed(qid, msg, exc)
            raise                               # the stdlib's exception, not ours
    return put


def put_failed(qid, msg, exc):
    """The put of `msg` raised `exc` after it was recorded: it never entered the queue. (mpviz's
    Queue, which encodes before it records the put, says so with msg None.) Called while `exc`
    is on its way to the caller: an event the Writer cannot take is said, never raised."""
    try:
        recorder.emit("queue.put_failed", queue=qid, msg=msg, error=type(exc).__name__)
    except Exception as failed:
        _unrecorded("queue.put_failed", failed)


_queue_put, _joinable_put = _tagging_put("Queue.put"), _tagging_put("JoinableQueue.put")



def for_feeder(q, obj, qid, msg):
    """What a recorded put hands to `q`'s feeder thread: `obj` tagged, so that the feeder's
    write hook reports the write (``queue.feed``); or in an envelope, when that feeder thread
    started before recording and so has no hook (see top). Used by the stdlib's put (hooked
    here) and by mpviz's Queue."""
    if q._thread is None or getattr(q, "_mpviz_hooked_feeder", None) is q._thread:
        return _Tag(obj, msg)
    return _Envelope(obj, "queue", qid, msg)


def _hooked(method):
    """Whether a queue's _send_bytes/_recv_bytes is our wrapper. The mark is on the wrapper, not
    the queue: a fork resets the queue's methods (``Queue._reset``) and so drops the mark too."""
    return hasattr(method, "_mpviz")


def _tap():
    """queue_hooks.c's ``Tap`` where the C Writer records: the two hooks below, in C; else None."""
    if recorder.writer_name() != "C":
        return None
    from . import native
    return native.load().Tap


def _unrecorded(kind, exc):
    """An event the Writer could not take (its on_error raised): say so; the message goes on.
    (queue_hooks.c's Tap does the same through sys.unraisablehook.)"""
    print(f"mpviz: {kind} not recorded ({type(exc).__name__}: {exc}); the message went through",
          file=sys.stderr)


def _fed(send_bytes, qid):
    """The feeder's write, recorded: the Python reference of ``Tap(send_bytes, ..., _feeding)``."""
    def fed_send_bytes(buf):
        if _stops.pause: _stops.pause("queue.feed", qid, nbytes=len(buf))  # stepped: stepper/gate
        # The event goes first: once a reader can have the bytes, their write is in the log --
        # even if recording stops, or this process is killed, right after the write.
        w = recorder.writer
        if w is not None:
            msg, _feeding.msg = getattr(_feeding, "msg", None), None
            if msg is None and _take_c_msg is not None:
                msg = _take_c_msg()             # pickled by queue_hooks.c's Pickler instead
            args = {"queue": qid, "msg": msg, "nbytes": len(buf), "sig": sig(buf)}
            if getattr(_feeding, "handles", 0):
                args["handles"], _feeding.handles = _feeding.handles, 0
            try:
                w.emit("queue.feed", args)
            except Exception as exc:
                _unrecorded("queue.feed", exc)
        return send_bytes(buf)
    fed_send_bytes._mpviz = True
    return fed_send_bytes


def _read(recv_bytes, qid):
    """The reader's read, recorded: the Python reference of ``Tap(recv_bytes, ..., None, mark)``."""
    def read_bytes(maxlength=None):
        res = recv_bytes() if maxlength is None else recv_bytes(maxlength)
        w = recorder.writer
        if w is not None and res.find(_ENVELOPE_MARK, 0, 64) < 0:  # envelopes: see _open
            try:
                w.emit("queue.get", {"queue": qid, "nbytes": len(res), "sig": sig(res)})
                got(qid)                        # it ends this get's wait, if it waited
            except Exception as exc:
                _unrecorded("queue.get", exc)
        return res
    read_bytes._mpviz = True
    return read_bytes


def _queue_start_thread(self):
    """Wrap the feeder's send: it runs under the write lock, so its event orders the writes."""
    if recorder.ENABLED and not _hooked(self._send_bytes):
        send_bytes, qid, tap = self._send_bytes, _queue_id(self), _tap()
        self._send_bytes = (_fed(send_bytes, qid) if tap is None
                            else tap(send_bytes, "queue.feed", qid, _feeding, None,
                                     _plain_pipe(send_bytes, self._writer)))
        # a write into a full pipe is a wait
        self._send_bytes = waits.feeder_writes(self._send_bytes, qid, self._writer.fileno())
    started = _orig["Queue._start_thread"](self)
    if _hooked(self._send_bytes):
        # Remember *which* feeder thread writes through our hook: a later one (after a fork, or
        # one started while not recording) must not pass for it (see for_feeder). mpviz's Queue
        # puts its own _send_bytes back once the thread has started, so the mark can't stay there.
        self._mpviz_hooked_feeder = self._thread
    return started


def _queue_get(self, block=True, timeout=None):
    if _stops.pause: _stops.pause("queue.get", _queue_id(self))  # a stepped run: see stepper/gate.py
    if recorder.ENABLED:
        watch_reads(self)
        if block and get_would_wait(self):          # nothing to read yet: a recorded wait
            return waiting_get(timeout, _orig["Queue.get"], self, block, timeout)
    return _orig["Queue.get"](self, block, timeout)


# --- a get on an empty queue, a put on a full one: waits (see waits.py) ----------------------
#
# Asked before the get or put, without blocking: a get that finds a message at once, or a put
# that finds a free place, costs one poll(2) or one look at a semaphore, and records no wait.
# (A get that found a message which another reader then took first blocks unrecorded.)

def readable(fd):
    """Whether a read of `fd` would return at once (bytes, or end of file): poll(2), timeout 0.
    (Where the C Writer records, messages.install_native puts queue_hooks.c's ``readable`` here.)"""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def get_would_wait(q):
    """Whether `q.get()` would wait now, as a recorded wait (see below): nothing to read, or
    a message there but another reader holding the queue's read lock. Called for every
    recorded get of mpviz's Queue: the Connection's fd is read as an attribute, not by a call."""
    fd = getattr(q._reader, "_handle", None)     # None: closed (the get itself says so)
    return fd is not None and _not_in_a_wait() and (not readable(fd) or _read_lock_held(q))


def _read_lock_held(q):
    """Whether another reader holds `q`'s read lock (only one reader at a time reads a Queue):
    a get that finds a message there still waits for that lock -- for ever, if its holder was
    killed inside its own get (terminate(): the multiprocessing docs' warning). One look at
    the semaphore, as put_would_wait's. (queue_hooks.c's read_lock_held is the same.)"""
    try:
        return q._rlock._semlock._is_zero()
    except (AttributeError, OSError):
        return False


def put_would_wait(q):
    """Whether `q.put(obj)` would wait now, as a recorded wait: a bounded queue with no free
    place (see below)."""
    try:
        return _not_in_a_wait() and q._sem._semlock._is_zero()
    except (AttributeError, OSError):
        return False


# get_would_wait and put_would_wait ask the same two questions, in the same order:
#   1. is this thread already inside a recorded wait? Then this one is not recorded: waits inside
#      waits are recorded once, the outermost (waits.py). mpviz's Queue.get calls the stdlib's
#      inside its own wait; a signal handler can get or put inside any wait, in the same thread.
#      A thread-local read, no system call: asked first.
#   2. would it block? A get: nothing in the pipe (poll(2)). A put: no free place (the
#      semaphore's count is 0).
# Neither asks whether recording is on: every caller has asked already (recorder.ENABLED, or the
# Writer it holds). queue_hooks.c asks the same: get_would_wait and hook_get (``inside_wait``),
# and for a put, put_may_wait, which sends a put that may wait here to ask again. (Where the C
# Writer records, install_native puts queue_hooks.c's not_in_a_wait here: a get's wait recorded
# in C marks a C thread-local, not waits._in_wait.)
def _not_in_a_wait():
    return waits._in_wait.on is None            # (None by default: waits._InWait)


_py_not_in_a_wait = _not_in_a_wait


def take_slot(q, block, timeout):
    """mpviz's Queue takes a place for its put (``q._sem.acquire``), recorded as a wait when
    the queue is full (see above)."""
    if block and put_would_wait(q):
        return waits.queue_wait(q._sem.acquire, q, (block, timeout), timeout,
                                judge=bool)         # False: timed out
    return q._sem.acquire(block, timeout)


def waiting_get(timeout, get, q, *more):
    """`get(q, *more)` -- a Queue's get that get_would_wait said will wait -- recorded as a wait
    on `q` (timeout: the get's, for the event): ``wait.begin``, ended by the ``queue.get`` of
    its read (waits.get_wait). Where the C Writer records, queue_hooks.c's version is used."""
    return waits.get_wait(get, q, (q,) + more, timeout)


# Called after each ``queue.get`` recorded here (_read, _open): it ends this thread's get's wait
# on that queue, if one is open (waits.got; queue_hooks.c's ``got`` where the C Writer records).
got = waits.got


# The Python versions of the three that a get's wait calls: install_native puts the C ones in
# their place while the C Writer records (the wait's event without a Python call), and these
# back when the Python Writer does.
_py_get_would_wait, _py_waiting_get, _py_got = get_would_wait, waiting_get, got


def _simple_get(self):
    """SimpleQueue.get, while recording: a wait when there is nothing to read yet."""
    if recorder.ENABLED and get_would_wait(self):
        _queue_id(self)                  # (computed once: the C waiting_get reads it from self)
        return waiting_get(None, _orig["SimpleQueue.get"], self)
    return _orig["SimpleQueue.get"](self)


def watch_reads(q):
    """Wrap `q`'s read (once): it runs under the read lock, so its event orders the reads.
    (mpviz's Queue has its own get, which calls this too while recording.)"""
    if not _hooked(q._recv_bytes):
        recv_bytes, qid, tap = q._recv_bytes, _queue_id(q), _tap()
        q._recv_bytes = (_read(recv_bytes, qid) if tap is None
                         else tap(recv_bytes, "queue.get", qid, None, _ENVELOPE_MARK,
                                  _plain_pipe(recv_bytes, q._reader)))


def _plain_pipe(method, conn):
    """`conn`, if `method` does nothing but move one framed message through it — the
    Connection's own recv_bytes or send_bytes, or mpviz's ``_pipe.read_message`` of its fd —
    so that queue_hooks.c's Tap may move the bytes itself (see there); else None: the Tap calls
    `method`."""
    try:
        if method == conn.recv_bytes or method == conn.send_bytes:
            return conn
        if getattr(method, "__self__", None) is conn and \
                method.__func__ in waits.PLAIN_RECV_BYTES:   # bound while the hook was not in
            return conn
        func = getattr(method, "func", None)           # functools.partial(read_message, fd)
        if getattr(func, "reads_one_message", False) and method.args == (conn.fileno(),):
            return conn
    except (AttributeError, OSError):                  # no Connection, or a closed one
        pass
    return None


def link_by_order(events):
    """Give each Queue read (a ``queue.get`` with ``sig``: no envelope) the id of the write it read.

    Per queue, the writes (``queue.feed`` and direct ``queue.put`` events, which carry ``sig``)
    and the reads, each in time order, are matched first to first: a pipe is FIFO, and both
    happen under the queue's locks. A read whose size and fingerprint differ from the next
    write's was not written while recording: it stays unlinked (``msg`` None), instead of
    shifting every later pair (identical messages, a run of ``None`` sentinels, cannot be told
    apart: such a read takes the next write's id). A live trace
    keeps an ``OrderLinks`` instead, which redoes only the pairs that new events can change."""
    OrderLinks().add(events)


class OrderLinks:
    """``link_by_order``, kept up to date as events arrive (``Trace.refresh``).

    Each queue keeps its writes and its reads in time order, and how many writes the reads up
    to each one have taken. Matching is first to first, so a read is paired by the reads and
    writes *before* it only: new events starting at time t leave every read before t as it was
    (the writes those reads took are all older than t). ``add`` inserts the new events and
    redoes the matching from the first read at t or later -- at the end of a live trace, that
    is only the new reads. The result is the same as ``link_by_order`` on all events.
    """

    def __init__(self):
        self._queues = {}          # queue id -> (writes, reads, taken: writes used up to read k)

    def add(self, events):
        """Take in `events` (in any order; those not about Queue pipes are ignored)."""
        since = {}                                 # queue id -> earliest new event's time
        for e in events:
            k = e.kind
            if k == "queue.feed" or (k == "queue.put" and "sig" in e.args):
                side = 0
            elif k == "queue.get" and "sig" in e.args:
                side = 1
            else:
                continue
            q = e.args["queue"]
            line = self._queues.setdefault(q, ([], [], []))[side]   # its writes or its reads
            if line and _order(e) < _order(line[-1]):
                bisect.insort(line, e, key=_order)      # a late arrival (a slower log)
            else:
                line.append(e)
            since[q] = min(since.get(q, e.ts_ns), e.ts_ns)
        for q, t in since.items():
            self._match(*self._queues[q], t)

    @staticmethod
    def _match(ws, rs, taken, t):
        start = bisect.bisect_left(rs, t, key=lambda r: r.ts_ns)
        del taken[start:]
        i = taken[-1] if taken else 0
        for r in rs[start:]:
            a = r.args
            if i < len(ws) and ws[i].ts_ns <= r.ts_ns and ws[i].args.get("nbytes") == a["nbytes"] \
                    and ws[i].args.get("sig") == a["sig"]:
                a["msg"] = ws[i].args.get("msg")
                i += 1
            else:
                a["msg"] = None
            taken.append(i)


def _simple_put(self, obj):
    if _stops.pause: _stops.pause("queue.put", _queue_id(self))  # a stepped run: see stepper/gate.py
    if not recorder.ENABLED or sys.is_finalizing():
        # (at the interpreter's end -- a Pool garbage-collected then puts into its change
        # notifier -- this module can no longer be imported, and an envelope cannot be pickled:
        # "Exception ignored in: Pool.__del__ ... PicklingError" on a program that has none)
        return _orig["SimpleQueue.put"](self, obj)
    # the stdlib's SimpleQueue.put, with the envelope and the size recorded
    qid, msg = _queue_id(self), next_msg()
    recorder.take_handles()
    data = ForkingPickler.dumps(_Envelope(obj, "queue", qid, msg))
    recorder.emit("queue.put", queue=qid, msg=msg, nbytes=len(data),
                  **carried(recorder.take_handles()))
    if self._wlock is None:
        self._writer.send_bytes(data)
    else:
        with self._wlock:
            self._writer.send_bytes(data)


def _conn_send(self, obj):
    if _stops.pause: _stops.pause("pipe.send", None)  # a stepped run: see stepper/gate.py
    if not recorder.ENABLED or sys.is_finalizing():       # (as in _simple_put)
        return _orig["Connection.send"](self, obj)
    # the stdlib's Connection.send, with the envelope and the size recorded
    self._check_closed()
    self._check_writable()
    end = self.__dict__.get("_mpviz_end")       # the program's own Pipe's end (waits.py)
    pipe, msg = end or f"pipe-{recorder.PID}-{self._handle}", next_msg()
    recorder.take_handles()
    data = ForkingPickler.dumps(_Envelope(obj, "pipe", pipe, msg))
    recorder.emit("pipe.send", pipe=pipe, msg=msg, nbytes=len(data),
                  **carried(recorder.take_handles()))
    if end is None:
        self._send_bytes(data)
    else:
        waits.pipe_send(self, end, data)        # a write into a full pipe is a wait


def carried(handles):
    """The put-side event's ``handles`` arg: how many handles pickling the message made (none:
    no arg, so a plain message's event stays as small as it was)."""
    return {"handles": handles} if handles else {}


# --- Pool tasks ----------------------------------------------------------------------------

class _TaskProbe:
    """Stands in for a Pool task's function; its call in the worker records start and done
    (``pool.task``)."""

    def __init__(self, func, job, index, chunk, name):
        self.func, self.job, self.index, self.chunk, self.name = func, job, index, chunk, name

    def __call__(self, *args, **kwargs):
        info = dict(job=self.job, index=self.index, chunk=self.chunk, func=self.name)
        if recorder.ENABLED:
            recorder.emit("pool.task", phase="start", **info)
        ok, error = False, None
        try:
            result = self.func(*args, **kwargs)
            ok = True
            return result
        except BaseException as exc:     # (what it raised: a result nobody asks for hides it)
            error = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            raise
        finally:
            if recorder.ENABLED:
                recorder.emit("pool.task", phase="done", ok=ok, **info, **(error or {}))


def _task_name(func, args):
    if func in (pool.mapstar, pool.starmapstar):   # map: args = ((user_func, chunk),)
        func, chunk = args[0][0], len(args[0][1])
    else:
        chunk = 1
    return getattr(func, "__qualname__", type(func).__name__), chunk


def _traced_quick_put(put):
    def quick_put(task):
        if recorder.ENABLED and task is not None:
            job, i, func, args, kwds = task
            if func is not pool._helper_reraises_exception:
                name, chunk = _task_name(func, args)
                recorder.emit("pool.task", phase="submit", job=job, index=i, chunk=chunk,
                              func=name)
                task = (job, i, _TaskProbe(func, job, i, chunk, name), args, kwds)
        return put(task)
    return quick_put


def _pool_setup_queues(self):
    _orig["Pool._setup_queues"](self)
    self._quick_put = _traced_quick_put(self._quick_put)


def _thread_pool_setup_queues(self):
    """A ThreadPool's tasks too (its workers are threads of this process; its queues are
    queue.SimpleQueue, set up by its own _setup_queues, which does not call Pool's)."""
    _orig["ThreadPool._setup_queues"](self)
    self._quick_put = _traced_quick_put(self._quick_put)


def install_native():
    """Where the C Writer records, put queue_hooks.c's versions of the per-message hooks in place of
    the Python ones that ``PATCHES`` installed (their originals are kept in ``_orig`` as ever,
    and ``hooks.uninstall`` puts those back). Each C hook does what its Python version here does
    and calls it for the cases it leaves out (see queue_hooks.c, "Tag, Pickler, Hook")."""
    global _take_c_msg, _c_feeding_handles, _c_numbering, readable, get_would_wait, waiting_get
    global got, _not_in_a_wait
    get_would_wait, waiting_get, got = _py_get_would_wait, _py_waiting_get, _py_got
    _not_in_a_wait, waits._outermost = _py_not_in_a_wait, waits._py_outermost
    if recorder.writer_class() is recorder.Writer or "Queue.put" not in _orig:
        return
    from . import native
    c = native.load()
    _TAG_TYPES.add(c.Tag)
    readable = c.readable                    # poll(2) without the select.poll object
    get_would_wait, waiting_get, got = c.get_would_wait, c.waiting_get, c.got
    # one rule for "inside a recorded wait?", whichever records the wait (see _not_in_a_wait)
    c.set_in_wait(waits._in_wait)
    _not_in_a_wait, waits._outermost = c.not_in_a_wait, c.outermost
    _take_c_msg, _c_feeding_handles = c.take_feeding_msg, c.set_feeding_handles
    if _c_numbering is None:
        _c_numbering = c.set_numbering
        _c_numbering(_counter, _prefix)
    me = sys.modules[__name__]
    for owner, attr, hook in [
            (queues, "_ForkingPickler", c.Pickler(_CountingPickler, _Tag)),
            (queues.Queue, "put", c.Hook("put", _orig["Queue.put"], _queue_put, me)),
            (queues.JoinableQueue, "put",
             c.Hook("put", _orig["JoinableQueue.put"], _joinable_put, me)),
            (queues.Queue, "get", c.Hook("get", _orig["Queue.get"], _queue_get, me))]:
        setattr(owner, attr, hook)


PATCHES = [
    (queues, "_ForkingPickler", _TagPickler, "queues._ForkingPickler"),
    (queues.Queue, "put", _queue_put, "Queue.put"),
    (queues.Queue, "get", _queue_get, "Queue.get"),
    (queues.JoinableQueue, "put", _joinable_put, "JoinableQueue.put"),
    (queues.Queue, "_start_thread", _queue_start_thread, "Queue._start_thread"),
    (queues.SimpleQueue, "put", _simple_put, "SimpleQueue.put"),
    (queues.SimpleQueue, "get", _simple_get, "SimpleQueue.get"),
    (connection._ConnectionBase, "send", _conn_send, "Connection.send"),
    (pool.Pool, "_setup_queues", _pool_setup_queues, "Pool._setup_queues"),
    (pool.ThreadPool, "_setup_queues", _thread_pool_setup_queues, "ThreadPool._setup_queues"),
]


# --- mpviz's own Queue (mpviz/multiprocessing/queues.py, _pipe.py) ---------------------------
#
# Its code records itself, at the line where each fact happens, behind one flag read
# (``recorder.ENABLED``, or ``recorder.writer`` where the Writer is used next): the put's
# failure (Queue.put), its handles and a full queue's wait (take_slot), the direct write
# (DirectWrite._write_now: put_written below), the feeder's way (Queue._parcel: for_feeder
# above), the read and an empty queue's wait (Queue.get: watch_reads, get_would_wait,
# waiting_get) and a message read but not rebuilt (Queue._receive). Nothing here patches it: the
# hooks above are for the stdlib's classes, which we cannot edit.

def put_written(q, ts, data):
    """mpviz's Queue wrote `data` into its pipe itself, at `ts` (taken under the write lock,
    before the bytes could be read): one ``queue.put`` {msg, nbytes, sig} for the put and the
    write, as the feeder's write has (and ``handles``, what encoding `data` pickled)."""
    w = recorder.writer
    if w is None:                               # recording stopped during the write
        return
    msg, handles = next_msg(), recorder.take_handles()
    try:
        if handles:
            w.emit_at(ts, "queue.put", {"queue": _queue_id(q), "msg": msg, "nbytes": len(data),
                                        "sig": sig(data), "handles": handles})
        else:
            w.queue_event(ts, "queue.put", _queue_id(q), msg, data)
    except Exception as exc:
        _unrecorded("queue.put", exc)
