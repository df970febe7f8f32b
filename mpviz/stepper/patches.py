"""Stops that the recorder has no hook for: ``Event.set/clear/wait`` (stepped processes only).

The recorder leaves Events alone (their inner locks would bury the picture in noise), but the
lost wake-up is about exactly these three calls. So a stepped process wraps them: each pauses
first (see gate.py), then runs the stdlib's method. ``object_id`` names a lock, queue or event
the way every process computes it, so that a name given in one process shows in all.
"""

from multiprocessing import queues, synchronize

from ..trace.messages import semlock_id

_orig = {}


def object_id(obj):
    """The id the recorder (and so the stepper) uses for `obj`, or None."""
    if isinstance(obj, synchronize.Event):
        return semlock_id(obj._flag)
    if isinstance(obj, (queues.Queue, queues.SimpleQueue)):
        return semlock_id(obj._rlock)
    if isinstance(obj, synchronize.SemLock):
        return semlock_id(obj)
    lid = getattr(obj, "_id", None)                 # a recorded threading lock
    return lid if isinstance(lid, str) else None


def _stop_then(op, method):
    def wrapper(self, *args, **kwargs):
        from . import gate
        if gate.pause:
            gate.pause(op, object_id(self))
        return _orig[method](self, *args, **kwargs)
    wrapper.__name__ = method.rsplit(".", 1)[1]
    return wrapper


_PATCHES = [(synchronize.Event, "set", "event.set"),
            (synchronize.Event, "clear", "event.clear"),
            (synchronize.Event, "wait", "event.wait")]


def install():
    """Wrap the Event methods (once per process)."""
    for owner, attr, op in _PATCHES:
        key = f"{owner.__name__}.{attr}"
        if key not in _orig:
            _orig[key] = getattr(owner, attr)
            setattr(owner, attr, _stop_then(op, key))


