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

from ..sharing import handles

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
    return handles.dumps_or_give_back(dumps, obj, channel)   # a half-made pickle gives back


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


# -- what a pickling error means ------------------------------------------------------------

# pickle's own words -> what the object is, and what to send instead
_KINDS = [
    (("<lambda>",), "a lambda",
     "define the function with def at the top level of a module and send that (or send the "
     "data it needs, and call it where it arrives)"),
    (("local object",), "a function or class defined inside another function",
     "move it to the top level of a module, so that the receiver can import it by name"),
    (("__main__",), "something defined in __main__ (the script, or a notebook cell)",
     "define it in a module (a .py file) that the receiver can import"),
    (("TextIOWrapper", "BufferedReader", "BufferedWriter", "BufferedRandom", "FileIO"),
     "an open file",
     "send the file's path (f.name) and open it where it arrives"),
    (("_thread.lock", "_thread.RLock", "socket", "SSLContext", "generator", "_io.BytesIO"),
     "an object tied to this process (a lock, a socket, a generator)",
     "send the plain data it holds; make locks with multiprocessing.Lock() and pass them to "
     "Process(args=...) when the child starts"),
    (("through inheritance",),           # (the stdlib's words for its Lock, Event, Queue, ...)
     "a multiprocessing Lock, Semaphore, Condition, Event or Queue (a process can only be "
     "given one as it starts: a child inherits it)",
     "pass it to the child when it starts: Process(target=f, args=(it,)), or "
     "Pool(initializer=f, initargs=(it,)); put plain data on queues"),
]


# Python 3.13's pickle says "Can't get local object 'f.<locals>.g'" (an AttributeError, no word
# of pickling) where 3.11, 3.12 and 3.14 say "Can't pickle local object ..."
_LOCAL_313 = "Can't get local object"


def explain_pickling_error(exc, call):
    """`exc` (pickle's error) again, of the same type, its words kept and followed by what
    `call` ("q.put(obj)", "conn.send(obj)") was doing, why it failed and how to fix it; or
    None when `exc` is not a pickling error."""
    words = str(exc)
    if not isinstance(exc, pickle.PicklingError) and not (
            isinstance(exc, (TypeError, AttributeError)) and
            ("pickle" in words.lower())) and not (
            isinstance(exc, AttributeError) and _LOCAL_313 in words) and not (
            isinstance(exc, RuntimeError) and "through inheritance" in words):
        return None
    if "pickle" not in words.lower() and "through inheritance" not in words:
        words = f"Can't pickle the object ({words})"   # (3.13's words never say pickle)
    said, fix = "pickle cannot carry it (or something it holds)", (
        "send plain data (numbers, str, lists, dicts, tensors) or objects of classes defined at "
        "the top level of a module")
    for needles, kind, how in _KINDS:
        if any(n in words for n in needles):
            said, fix = f"it is (or holds) {kind}, which pickle cannot carry", how
            break
    return type(exc)(
        f"{words}: {call} pickles the object to send it to another process, and {said}. "
        f"Nothing was sent. Fix: {fix}.")


def raise_explained(exc, call):
    """Raise `exc` explained (:func:`explain_pickling_error`) if it is a pickling error; else
    return, and the caller re-raises it as it is."""
    clear = explain_pickling_error(exc, call)
    if clear is not None:
        try:
            raise clear from None
        finally:
            del clear        # (no cycle: this frame -> the error -> its traceback -> here)
