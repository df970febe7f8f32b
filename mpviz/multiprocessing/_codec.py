"""What a message is: the bytes that mpviz's Queue puts in its pipe for an object, and back.

Two kinds of message, told apart by their first byte::

    b"T" + marshal.dumps((offset, shape, strides, dtype, requires_grad, <storage handle>))
         a lone plain tensor, the usual thing to put: its *short handle* (which memory,
         which view of it), made by ``reductions.pack_tensor``
    b"\\x80..."
         anything else: a pickle (protocol 2 and up starts with the byte 0x80), made with
         ForkingPickler's reducers, so a tensor inside shares its memory as it is pickled

``encode`` runs in ``put`` (so a tensor is in shared memory before ``put`` returns, and a
pickling error reaches the caller); ``decode`` runs in ``get``. Why two kinds: ``marshal``
writes and reads a flat tuple with no Python call, while pickling a handle means reducers
called from C, a pickler and its memo, and an import on arrival (see ``reductions.py``).

Adapted from ``multiprocessing.reduction.ForkingPickler.dumps``/``loads``; left out: nothing
of the pickle; added: the short handle, and giving back the handles of a half-made pickle.
"""
import collections
import copyreg
import io
import marshal
import pickle
from multiprocessing.reduction import ForkingPickler

# reductions.py (how a tensor travels) needs NumPy; it is imported by the first message, so that a
# spawned child that only passes numbers, or nothing, starts without it.
reductions = None


def _reductions():
    global reductions
    from . import reductions
    return reductions


TENSOR = b"T"
_MARSHAL_VERSION = 2  # 3 and up also mark repeated objects: a hash table per call, here for nothing


def encode(obj, channel=None):
    """The bytes that carry `obj`: a plain tensor's short handle, or the pickle of anything
    else — which, if it fails half-way, gives back the handles it made. `channel`: the inode of
    the pipe they will travel in (the shm manager's record of where a handle went)."""
    red = reductions or _reductions()
    handle = red.pack_tensor(obj, channel)
    if handle is not None:
        return TENSOR + marshal.dumps(handle, _MARSHAL_VERSION)
    return red.dumps_or_give_back(dumps, obj, channel)


def decode(data):
    """The object that :func:`encode` made `data` of, rebuilt in this process."""
    if data[:1] == TENSOR:
        return (reductions or _reductions()).unpack_tensor(marshal.loads(data[1:]))
    return ForkingPickler.loads(data)


class HandlePickler(pickle.Pickler):
    """Pickles exactly as ForkingPickler does (its reducers first, then copyreg's), without its
    per-call cost: ``ForkingPickler.dumps`` copies the whole ``copyreg`` dispatch table into
    every new pickler; a class-level ``ChainMap`` over the same two tables sees the same
    reducers, including ones registered later."""

    dispatch_table = collections.ChainMap(ForkingPickler._extra_reducers, copyreg.dispatch_table)


def dumps(obj):
    """`obj` pickled with :class:`HandlePickler` (what ``ForkingPickler.dumps(obj)`` gives)."""
    buf = io.BytesIO()
    HandlePickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class Pickled:
    """Bytes that ``put`` already encoded, on their way through the feeder thread: the feeder
    pickles whatever it is given, and this pickles as "decode these bytes" (a copy of them, not
    a second pickling of the object), so ``get`` finds the object itself on arrival."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce__(self):
        return (decode, (self.data,))
