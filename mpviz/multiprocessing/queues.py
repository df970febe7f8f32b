"""Queues that pickle in ``put``, so tensors are shared before ``put`` returns.

The stdlib ``multiprocessing.Queue.put`` only appends the object to a list; a *feeder thread*
pickles it later and writes it to a pipe::

    stdlib:   put(t) ─▶ buffer ─▶ [feeder thread] pickle(t) ─▶ pipe ─▶ get()
                 │
                 └─ returns at once: t.is_shared() is still False, and a pickling error is
                    printed by the feeder thread — your code never sees it (a lost message).

    mpviz:    put(t) ─▶ pickle(t) here ─▶ buffer ─▶ [feeder thread] ─▶ pipe ─▶ get()
                           │
                           └─ t is in shared memory now; errors are raised to the caller.

The pickled bytes travel inside a tiny :class:`_Pickled` wrapper that the feeder thread pickles
again (a few hundred bytes for a tensor: just its handle) and ``get`` unwraps on arrival.
"""
import multiprocessing.queues
from multiprocessing.reduction import ForkingPickler


class _Pickled:
    """An object already pickled by ``put``; unpickles to the original object in ``get``."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce__(self):
        return (_loads, (self.data,))


def _loads(data):
    return ForkingPickler.loads(data)


def _dumps(obj):
    return bytes(ForkingPickler.dumps(obj))


class Queue(multiprocessing.queues.Queue):
    """``multiprocessing.Queue`` whose ``put`` pickles (and so shares tensors) synchronously."""

    def put(self, obj, block=True, timeout=None):
        super().put(_Pickled(_dumps(obj)), block, timeout)


class JoinableQueue(multiprocessing.queues.JoinableQueue):
    """``multiprocessing.JoinableQueue`` whose ``put`` pickles synchronously."""

    def put(self, obj, block=True, timeout=None):
        super().put(_Pickled(_dumps(obj)), block, timeout)
