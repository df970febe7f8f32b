"""Stops that the recorder has no hook for (stepped processes only): ``Event.set/clear/wait``,
``Condition.wait/notify/notify_all`` and a pipe's ``Connection.recv``.

The recorder leaves Events and Conditions alone (their inner locks would bury the picture in
noise), but the lost wake-up is about exactly these calls; and it records a pipe's receive when
the message is unpickled, after the wait. So a stepped process wraps them: each pauses first
(see gate.py), then runs the stdlib's method. ``object_id`` names a lock, queue or event
the way every process computes it, so that a name given in one process shows in all.
"""

import threading
from multiprocessing import connection, queues, synchronize

from .. import _stops
from ..trace.events import semlock_id

_orig = {}


def object_id(obj):
    """The id the recorder (and so the stepper) uses for `obj`, or None."""
    if isinstance(obj, synchronize.Event):
        return semlock_id(obj._flag)
    if isinstance(obj, synchronize.Condition):
        return semlock_id(obj._sleeping_count)
    if isinstance(obj, (queues.Queue, queues.SimpleQueue)):
        return semlock_id(obj._rlock)
    if isinstance(obj, synchronize.SemLock):
        return semlock_id(obj)
    lid = getattr(obj, "_id", None)                 # a recorded threading lock
    return lid if isinstance(lid, str) else None


_inside = threading.local()      # .depth: in one of these methods (an Event's set calls its
                                 # Condition's notify_all: one stop, the Event's, not two)


def _stop_then(op, method):
    def wrapper(self, *args, **kwargs):
        depth = getattr(_inside, "depth", 0)
        if _stops.pause and depth == 0:
            _stops.pause(op, object_id(self) if op != "pipe.recv" else None)
        _inside.depth = depth + 1
        try:
            return _orig[method](self, *args, **kwargs)
        finally:
            _inside.depth = depth
    wrapper.__name__ = method.rsplit(".", 1)[1]
    return wrapper


_PATCHES = [(synchronize.Event, "set", "event.set"),
            (synchronize.Event, "clear", "event.clear"),
            (synchronize.Event, "wait", "event.wait"),
            (synchronize.Condition, "wait", "condition.wait"),
            (synchronize.Condition, "notify", "condition.notify"),
            (synchronize.Condition, "notify_all", "condition.notify_all"),
            (connection._ConnectionBase, "recv", "pipe.recv")]


def install():
    """Wrap the Event methods (once per process)."""
    for owner, attr, op in _PATCHES:
        key = f"{owner.__name__}.{attr}"
        if key not in _orig:
            _orig[key] = getattr(owner, attr)
            setattr(owner, attr, _stop_then(op, key))


