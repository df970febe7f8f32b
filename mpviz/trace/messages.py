"""Linking a put to its get across processes: message envelopes.

A queue moves *bytes*; nothing in them says which put they came from. While recording, the put
side wraps the user's object in an envelope that carries a message id::

    producer                                   consumer
    q.put(obj) ─► emit queue.put(msg=7.3)
                  buffer ◄─ Envelope(obj, "7.3")
    feeder thread: pickle(Envelope) = the bytes of
                   _open("queue", q, "7.3", obj)  ──► pipe ──► q.get(): unpickle: obj first,
                   emit queue.feed(nbytes)                     then _open(..., obj):
                                                               emit queue.get(msg=7.3)
                                                               return obj

The receiver needs no hook: unpickling the envelope *is* the hook, and it returns exactly the
object the stdlib would have returned. The object is pickled inline, once, by the stdlib's own
pickler; the feeder thread's send is wrapped to learn the size. Pipes (``Connection.send``) and
``SimpleQueue`` pickle in the caller, so there the put event carries the size itself.

Pool tasks ride the same way: ``Pool._quick_put`` (the task thread's send) wraps each task's
function in a ``_TaskProbe``, whose call in the worker records ``pool.task`` start and done.

Adapted from the idea of context propagation in distributed tracing (a trace id in the message);
left out: per-message handles (the core's own shm.attach events show them).
"""
import itertools
import threading

from multiprocessing import connection, pool, queues
from multiprocessing.reduction import ForkingPickler

from . import recorder

_counter = itertools.count(1)
_counter_pid = None


def _next_msg():
    global _counter, _counter_pid
    pid = recorder.PID
    if pid != _counter_pid:                   # a forked child starts its own numbering
        _counter, _counter_pid = itertools.count(1), pid
    return f"{pid}.{next(_counter)}"


def _queue_id(q):
    qid = q.__dict__.get("_mpviz_qid")
    if qid is None:
        qid = q._mpviz_qid = semlock_id(q._rlock)
    return qid


def semlock_id(lock):
    """A name for a multiprocessing lock that every process computes the same way."""
    sl = lock._semlock
    return sl.name.lstrip("/") if sl.name else f"sem-{sl.handle:x}"


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
        _feeding.msg = (self.channel, self.msg)     # for the feeder's size report, below
        return _open, (self.kind, self.channel, self.msg, self.obj)


_RECEIVE = {"queue": "queue.get", "pipe": "pipe.recv"}
_KEY = {"queue": "queue", "pipe": "pipe"}


def _open(kind, channel, msg, obj):
    """Runs in the receiver, while it unpickles: record the get, return the user's object."""
    if recorder.ENABLED:
        recorder.emit(_RECEIVE[kind], **{_KEY[kind]: channel}, msg=msg)
    return obj


# --- the put side: patched methods (installed by hooks.py while recording) -------------------

_orig = {}
_feeding = threading.local()


def _queue_put(self, obj, block=True, timeout=None):
    if recorder.ENABLED:
        qid, msg = _queue_id(self), _next_msg()
        recorder.emit("queue.put", queue=qid, msg=msg)
        obj = _Envelope(obj, "queue", qid, msg)
    return _orig["Queue.put"](self, obj, block, timeout)


def _joinable_put(self, obj, block=True, timeout=None):
    if recorder.ENABLED:
        qid, msg = _queue_id(self), _next_msg()
        recorder.emit("queue.put", queue=qid, msg=msg)
        obj = _Envelope(obj, "queue", qid, msg)
    return _orig["JoinableQueue.put"](self, obj, block, timeout)


def _queue_start_thread(self):
    """A Queue pickles in its feeder thread: wrap the feeder's send to learn each size."""
    if recorder.ENABLED and not hasattr(self._send_bytes, "_mpviz"):
        send_bytes = self._send_bytes

        def sized_send_bytes(buf):
            if recorder.ENABLED:
                channel, msg = getattr(_feeding, "msg", (None, None))
                _feeding.msg = (None, None)
                if msg is not None:
                    recorder.emit("queue.feed", queue=channel, msg=msg, nbytes=len(buf))
            return send_bytes(buf)
        sized_send_bytes._mpviz = True
        self._send_bytes = sized_send_bytes
    return _orig["Queue._start_thread"](self)


def _simple_put(self, obj):
    if not recorder.ENABLED:
        return _orig["SimpleQueue.put"](self, obj)
    # the stdlib's SimpleQueue.put, with the envelope and the size recorded
    qid, msg = _queue_id(self), _next_msg()
    data = ForkingPickler.dumps(_Envelope(obj, "queue", qid, msg))
    recorder.emit("queue.put", queue=qid, msg=msg, nbytes=len(data))
    if self._wlock is None:
        self._writer.send_bytes(data)
    else:
        with self._wlock:
            self._writer.send_bytes(data)


def _conn_send(self, obj):
    if not recorder.ENABLED:
        return _orig["Connection.send"](self, obj)
    # the stdlib's Connection.send, with the envelope and the size recorded
    self._check_closed()
    self._check_writable()
    pipe, msg = f"pipe-{recorder.PID}-{self._handle}", _next_msg()
    data = ForkingPickler.dumps(_Envelope(obj, "pipe", pipe, msg))
    recorder.emit("pipe.send", pipe=pipe, msg=msg, nbytes=len(data))
    self._send_bytes(data)


# --- Pool tasks ----------------------------------------------------------------------------

class _TaskProbe:
    """Stands in for a Pool task's function; its call in the worker records start and done."""

    def __init__(self, func, job, index, chunk, name):
        self.func, self.job, self.index, self.chunk, self.name = func, job, index, chunk, name

    def __call__(self, *args, **kwargs):
        info = dict(job=self.job, index=self.index, chunk=self.chunk, func=self.name)
        if recorder.ENABLED:
            recorder.emit("pool.task", phase="start", **info)
        ok = False
        try:
            result = self.func(*args, **kwargs)
            ok = True
            return result
        finally:
            if recorder.ENABLED:
                recorder.emit("pool.task", phase="done", ok=ok, **info)


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


PATCHES = [
    (queues.Queue, "put", _queue_put, "Queue.put"),
    (queues.JoinableQueue, "put", _joinable_put, "JoinableQueue.put"),
    (queues.Queue, "_start_thread", _queue_start_thread, "Queue._start_thread"),
    (queues.SimpleQueue, "put", _simple_put, "SimpleQueue.put"),
    (connection._ConnectionBase, "send", _conn_send, "Connection.send"),
    (pool.Pool, "_setup_queues", _pool_setup_queues, "Pool._setup_queues"),
]
