"""Linking a put to its get across processes: message envelopes.

A queue moves *bytes*; nothing in them says which put they came from. While recording, the put
side wraps the user's object in an envelope that carries a message id::

    producer                                   consumer
    q.put(obj) ─► emit queue.put(msg=7.3)
                  buffer ◄─ Envelope(obj, "7.3")
    feeder thread: pickle(Envelope)
        └─ Envelope.__reduce__ pickles obj ──► pipe ──► q.get(): unpickle
           emit queue.feed(nbytes)                      └─ _open("queue", q, "7.3", bytes)
           returns (_open, (..., bytes))                    emit queue.get(msg=7.3, nbytes)
                                                            return pickle.loads(bytes) ─► obj

The receiver needs no hook: unpickling the envelope *is* the hook, and it returns exactly the
object the stdlib would have returned. Pipes (``Connection.send``) and ``SimpleQueue`` pickle in
the caller, so their envelope is packed there and the send event knows its size at once.

Pool tasks ride the same way: ``Pool._quick_put`` (the task thread's send) wraps each task's
function in a ``_TaskProbe``, whose call in the worker records ``pool.task`` start and done.

Adapted from the idea of context propagation in distributed tracing (a trace id in the message);
left out: per-message handles (the core's own shm.attach events show them).
"""
import itertools
import os

from multiprocessing import connection, pool, queues
from multiprocessing.reduction import ForkingPickler

from . import recorder

_counter = itertools.count(1)
_counter_pid = None


def _next_msg():
    global _counter, _counter_pid
    pid = os.getpid()
    if pid != _counter_pid:                   # a forked child starts its own numbering
        _counter, _counter_pid = itertools.count(1), pid
    return f"{pid}.{next(_counter)}"


def semlock_id(lock):
    """A name for a multiprocessing lock that every process computes the same way."""
    sl = lock._semlock
    return sl.name.lstrip("/") if sl.name else f"sem-{sl.handle:x}"


# --- the envelope (pickled lazily, by the queue's feeder thread) ----------------------------

class _Envelope:
    __slots__ = ("obj", "kind", "channel", "msg")

    def __init__(self, obj, kind, channel, msg):
        self.obj, self.kind, self.channel, self.msg = obj, kind, channel, msg

    def __reduce__(self):
        data = bytes(ForkingPickler.dumps(self.obj))
        if recorder.ENABLED:
            recorder.emit(f"{self.kind}.feed", queue=self.channel, msg=self.msg, nbytes=len(data))
        return _open, (self.kind, self.channel, self.msg, data)


class _Packed:
    """An envelope already pickled by the sender (pipes, SimpleQueue)."""
    __slots__ = ("kind", "channel", "msg", "data")

    def __init__(self, kind, channel, msg, data):
        self.kind, self.channel, self.msg, self.data = kind, channel, msg, data

    def __reduce__(self):
        return _open, (self.kind, self.channel, self.msg, self.data)


_RECEIVE = {"queue": "queue.get", "pipe": "pipe.recv"}
_KEY = {"queue": "queue", "pipe": "pipe"}


def _open(kind, channel, msg, data):
    """Runs in the receiver, while it unpickles: record the get, return the user's object."""
    if recorder.ENABLED:
        recorder.emit(_RECEIVE[kind], **{_KEY[kind]: channel}, msg=msg, nbytes=len(data))
    return ForkingPickler.loads(data)


# --- the put side: patched methods (installed by hooks.py while recording) -------------------

_orig = {}


def _queue_put(self, obj, block=True, timeout=None):
    if recorder.ENABLED:
        qid, msg = semlock_id(self._rlock), _next_msg()
        recorder.emit("queue.put", queue=qid, msg=msg, nbytes=None)
        obj = _Envelope(obj, "queue", qid, msg)
    return _orig["Queue.put"](self, obj, block, timeout)


def _joinable_put(self, obj, block=True, timeout=None):
    if recorder.ENABLED:
        qid, msg = semlock_id(self._rlock), _next_msg()
        recorder.emit("queue.put", queue=qid, msg=msg, nbytes=None)
        obj = _Envelope(obj, "queue", qid, msg)
    return _orig["JoinableQueue.put"](self, obj, block, timeout)


def _simple_put(self, obj):
    if recorder.ENABLED:
        qid, msg = semlock_id(self._rlock), _next_msg()
        data = bytes(ForkingPickler.dumps(obj))
        recorder.emit("queue.put", queue=qid, msg=msg, nbytes=len(data))
        obj = _Packed("queue", qid, msg, data)
    return _orig["SimpleQueue.put"](self, obj)


def _conn_send(self, obj):
    if recorder.ENABLED and not self.closed:
        pipe, msg = f"pipe-{os.getpid()}-{self._handle}", _next_msg()
        data = bytes(ForkingPickler.dumps(obj))
        recorder.emit("pipe.send", pipe=pipe, msg=msg, nbytes=len(data))
        obj = _Packed("pipe", pipe, msg, data)
    return _orig["Connection.send"](self, obj)


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
    (queues.SimpleQueue, "put", _simple_put, "SimpleQueue.put"),
    (connection._ConnectionBase, "send", _conn_send, "Connection.send"),
    (pool.Pool, "_setup_queues", _pool_setup_queues, "Pool._setup_queues"),
]
