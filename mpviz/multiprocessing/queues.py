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

``put`` pickles with :class:`_HandlePickler`, which is ``ForkingPickler`` without its per-call
cost: ``ForkingPickler.dumps`` copies the whole ``copyreg`` dispatch table into every new
pickler (~6 µs of a ~20 µs put, measured with cProfile in issue #8); a class-level
``ChainMap`` over the same two tables sees the same reducers, including ones registered later.
"""
import collections
import copyreg
import io
import multiprocessing.queues
import pickle
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


class _HandlePickler(pickle.Pickler):
    """Pickles exactly as ForkingPickler does (its reducers first, then copyreg's)."""

    dispatch_table = collections.ChainMap(ForkingPickler._extra_reducers, copyreg.dispatch_table)


def _dumps(obj):
    buf = io.BytesIO()
    _HandlePickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class Queue(multiprocessing.queues.Queue):
    """``multiprocessing.Queue`` whose ``put`` pickles (and so shares tensors) synchronously."""

    def put(self, obj, block=True, timeout=None):
        super().put(_Pickled(_dumps(obj)), block, timeout)


class JoinableQueue(multiprocessing.queues.JoinableQueue):
    """``multiprocessing.JoinableQueue`` whose ``put`` pickles synchronously."""

    def put(self, obj, block=True, timeout=None):
        super().put(_Pickled(_dumps(obj)), block, timeout)
