"""How tensors and storages cross a process boundary: pickled as handles, never as bytes.

``multiprocessing`` pickles everything it sends (Queue, SimpleQueue, Pipe, Pool tasks and results,
Process arguments under spawn/forkserver) with its ``ForkingPickler``. ``init_reductions()``
registers two functions with it, so every one of those channels carries handles::

    reduce_tensor(t)   ->  rebuild, ("tensor", class (None: Tensor), <storage>, offset, shape,
                                     strides, dtype code, requires_grad, grad)
    reduce_storage(s)  ->  s.share_memory_()  (moves the bytes, in place, if they were private)
                           then by strategy:
                             file_descriptor: rebuild, ("storage_fd", sender's address, sender
                                              pid, key (strategy, st_dev, st_ino: which
                                              file the memory is), token, nbytes, name)
                             file_system:     rebuild, ("storage_filename", "/mpviz_…", nbytes,
                                              sender pid)

Views share one storage object, which pickle writes once per message: they arrive as views of
one storage. A handle takes a count (and an fd offer) for its receiver; a message that fails
half-way gives them back (:mod:`mpviz.sharing.handles`). ``rebuild_*`` looks in the receive cache
(:mod:`mpviz.sharing.cache`) first: a storage this process maps -- or just sent and dropped, kept
a moment -- comes back as the same object, with no descriptor and no mapping; then, with the
shared-memory cache on, in :mod:`mpviz.sharing.allocator`.

Adapted from torch's ``torch/multiprocessing/reductions.py`` (same names). Differences: ``.grad``
travels when set (torch 2.x drops it: its receiver sees None); CUDA tensors go to mpviz.cuda.
"""
import functools
import multiprocessing
import os
from multiprocessing.reduction import ForkingPickler

import numpy as np

from ..sharing import allocator, cache, fd_passing, file_descriptor, file_system, handles
from ..storage import Storage
from ..tensor import Tensor
from .. import _stops
from ..trace import recorder


# -- tensors --------------------------------------------------------------------------------------

def reduce_tensor(tensor):
    """Pickle `tensor` as (its class, its storage, how it views that storage, its grad).

    Note: ``.grad`` is sent, and shared, when it is set — as torch's multiprocessing note says
    ("If torch.Tensor.grad is not None, it is also shared"). PyTorch 2.x does *not* do this: its
    ``reduce_tensor`` leaves ``.grad`` behind, and the receiver's is ``None``. A grad created later
    in the receiver is the receiver's own either way.
    """
    _check_sendable(tensor)
    if tensor.is_cuda:
        from .. import cuda
        return cuda.reduce_tensor(tensor)
    cls = type(tensor)
    return (rebuild, ("tensor", None if cls is Tensor else cls, tensor._storage, tensor._offset,
                      tensor._shape, tensor._strides, _dtype_code(tensor.dtype),
                      tensor.requires_grad, tensor.grad))


def _check_sendable(tensor):
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd "
            "does not support crossing process boundaries. If you just want to transfer the "
            "data, call detach() on the tensor before serializing (e.g., putting it on the queue).")


def _dtype_code(dtype):
    # 'f' for float32: one character names every numeric dtype in this machine's byte order
    # (and costs a tenth of dtype.str, which formats "<f4" anew at each call); others: "<f4"
    return dtype.char if dtype.isnative else dtype.str


def rebuild(kind, *args):
    """The one function every handle names: rebuild a thing of `kind` from `args`.

    Each *different* function or class named in a pickle costs an
    import to write (the pickler checks that the name finds the same object) and a lookup to read;
    named again, it costs nothing (the pickle refers back). So all handles name one function,
    :func:`rebuild`, with the kind of thing to rebuild first, and a plain ``Tensor`` sends ``None``
    for its class. mpviz's own ``Queue`` goes further for a lone plain tensor: its *short handle*,
    the same facts as one flat tuple, ``marshal``-ed (:func:`pack_tensor`, :func:`unpack_tensor`;
    see _codec.py). What each saves: docs/PERFORMANCE.md."""
    if kind != "tensor":
        _stop_before_attach(kind, args)   # a stepped run: mapping shared memory is a stop
    return _REBUILD[kind](*args)


def _stop_before_attach(kind, args):
    """In a stepped run (mpviz.stepper), wait for the learner's "go" before this process maps
    the segment a handle names -- unless it maps that segment already (the receive cache), which
    attaches nothing. Every channel a storage arrives by (a queue, a pipe, a spawned child's
    Process arguments) comes through here. Costs an attribute read when nothing is stepped (the
    stepper fills the slot ``_stops.pause``: mpviz/_stops.py)."""
    if _stops.pause is None:
        return
    if kind == "storage_fd":
        _, _, key, _, nbytes, name = args
    elif kind == "storage_filename":
        name, nbytes, _ = args
        key = (file_system.STRATEGY, name)
    else:
        return
    if cache.get(key) is None:
        # a spawned child unpickles its Process (and so its arguments) while _inheriting is set
        arguments = getattr(multiprocessing.current_process(), "_inheriting", False)
        _stops.pause("shm.attach", name, nbytes=nbytes, arguments=arguments)


def rebuild_tensor(cls, storage, offset, shape, strides, dtype, requires_grad, grad):
    tensor = Tensor.__new__(cls or Tensor)
    Tensor.__init__(tensor, storage, offset, shape, strides, _dtype(dtype), requires_grad)
    tensor.grad = grad
    return tensor


_dtype = functools.lru_cache(maxsize=None)(np.dtype)   # dtype code -> np.dtype, made once


# -- the short way: a lone tensor put on an mpviz Queue ------------------------------------------
#
# Most of a pickled handle's cost is pickle's, not the handle's: a reducer called from C for the
# tensor and again for its storage, a pickler made and its memo filled, and the one function
# every handle names — written as a module and a name, looked up again (an import) on arrival.
# A lone plain tensor, the usual thing to put on a queue, needs none of that: its handle is a
# flat tuple of numbers and strings, which ``marshal`` (the format of .pyc files) writes and
# reads with no Python call (the counts: docs/PERFORMANCE.md).
# mpviz's Queue sends it that way (see ``_codec.encode``); everything else is pickled.

def pack_tensor(tensor, channel=None):
    """`tensor`'s whole handle, view and storage, as one flat tuple of plain data; None for
    what must be pickled (anything but a plain Tensor: a subclass, a CUDA tensor, one with a
    ``.grad``, or no tensor at all). `channel`: the queue pipe it will travel in (see above)."""
    if type(tensor) is not Tensor or tensor.grad is not None or tensor._storage.device != "cpu":
        return None
    _check_sendable(tensor)
    return (tensor._offset, tensor._shape, tensor._strides, _dtype_code(tensor.dtype),
            tensor.requires_grad) + storage_handle(tensor._storage, channel)


def unpack_tensor(handle):
    """The tensor that :func:`pack_tensor` made `handle` of, rebuilt in this process."""
    offset, shape, strides, dtype, requires_grad = handle[:5]
    storage = rebuild(*handle[5:])
    return rebuild_tensor(None, storage, offset, shape, strides, dtype, requires_grad, None)


# -- storages -------------------------------------------------------------------------------------

def reduce_storage(storage):
    """Share `storage` (in place) if it is private, then pickle a handle to it."""
    return (rebuild, storage_handle(storage, handles.channel()))


def storage_handle(storage, channel=None):
    """Share `storage` (in place) if it is private; return its handle: plain data, starting with
    the kind of thing to rebuild (``rebuild(*handle)`` in the receiver gives the storage).
    `channel`: the inode of the queue pipe the handle will travel in, or None (unknown).

    **Counts.** Each handle in flight is counted in the segment's header (``segment.incref()``, one
    atomic add); the receiver that maps the segment takes the count over, one that maps it already
    gives it back. So 1 means "one process maps it, no message names it": what the allocator needs
    to reuse a segment, ``file_system`` to unlink a name, the shm manager to keep one. A message
    that fails half-way (``q.put((t, lambda: 0))``, ``conn.send((t, lambda: 0))``, any channel)
    gives back what its handles took (:mod:`mpviz.sharing.handles`). Under ``file_system`` a
    handle also writes which queue pipe carries it (``channel``; ``None`` for a ``Pipe``,
    ``SimpleQueue``, ``Pool``, a Process argument), for the shm manager."""
    if storage.device != "cpu":
        raise RuntimeError("Cannot pickle CUDA storage; try pickling a CUDA tensor instead "
                           "(mpviz: a tensor travels as a counted CUDA IPC handle; a bare storage "
                           "would not be counted. Fix: send the tensor that views it.)")
    segment = storage.share_memory_()._segment  # a private one moves into shared memory, in place
    cache.put(segment.key, storage)  # so that it comes back to us as itself
    if recorder.ENABLED:
        recorder.count_handle()  # the message being pickled carries one more handle
    if segment.strategy == file_descriptor.STRATEGY:
        # Count the handle in flight (an atomic add on the segment's header), so the segment is
        # not reused before the receiver has it; then promise its descriptor.
        segment.incref()
        try:
            address, token = fd_passing.offer(storage)
        except BaseException:
            segment.decref()
            raise
        handles.note_taken(segment, token)
        if recorder.ENABLED:
            # only promised here: the fd goes when the receiver asks (fd.send, fd_passing.py)
            recorder.emit("fd.offer", name=segment.name, token=token, nbytes=segment.nbytes)
        return ("storage_fd", address, os.getpid(), segment.key, token, segment.nbytes,
                segment.name)
    # file_system: say which channel the handle takes (before it is counted: killed in between, the
    # manager would see one pipe too many, never one too few), then count it, which also makes
    # the name outlive us if we let go first, or die (the shm manager reads both).
    segment.note_channel(channel)
    segment.incref()
    handles.note_taken(segment, None)
    file_system.keep_after_send(storage)  # if received: kept a moment, in case it comes back
    return ("storage_filename", segment.name, segment.nbytes, os.getpid())


def rebuild_storage_fd(address, sender_pid, key, token, nbytes, name):
    storage = cache.get(key)
    if storage is not None:
        storage._segment.decref()  # the handle's count: we are counted already
        fd_passing.release(address, token, sender_pid, name)  # we map it already: no fd needed
        return storage
    segment = allocator.take_received(key)  # a mapping we kept (shared-memory cache on)?
    # (it takes over the handle's count, as a new mapping would)
    if segment is not None:
        fd_passing.release(address, token, sender_pid, name)  # we map it: no fd needed
    else:
        fd = fd_passing.fetch(address, token, sender_pid, name)
        if recorder.ENABLED:
            recorder.emit("fd.recv", name=name, token=token, peer=sender_pid, nbytes=nbytes)
        segment = file_descriptor.from_received_fd(fd, nbytes, name)
    storage = Storage(_segment=segment)
    storage._sent_from = sender_pid
    cache.put(key, storage)
    return storage


def rebuild_storage_filename(name, nbytes, sender_pid):
    key = (file_system.STRATEGY, name)
    storage = cache.get(key)
    if storage is not None:
        storage._segment.decref()  # the handle's reference: we hold the segment already
        return storage
    # a mapping we kept (shared-memory cache on), or a new one; both tell the manager
    segment = allocator.take_received(key) or file_system.attach(name, nbytes)
    storage = Storage(_segment=segment)
    storage._sent_from = sender_pid
    cache.put(key, storage)
    return storage


_REBUILD = {"tensor": rebuild_tensor, "storage_fd": rebuild_storage_fd,
            "storage_filename": rebuild_storage_filename}


def init_reductions():
    """Teach multiprocessing's pickler to send tensors and storages as handles: the one place
    mpviz registers its reducers (as torch's ``init_reductions``). Run when this module is
    imported; until then, storage.py's ``reduce_on_first_send`` stands in and imports it.

    Every class defined so far: Storage and its subclasses (CudaStorage: refused in
    ``storage_handle``), Tensor and its subclasses (nn.Parameter; a CUDA tensor goes to
    mpviz.cuda in ``reduce_tensor``). A subclass defined later is sent as its base is
    (``storage.send_as_base``). Plain ``pickle.dumps`` does not use these reducers and copies
    the bytes, as in torch."""
    for base, reducer in ((Storage, reduce_storage), (Tensor, reduce_tensor)):
        todo = [base]
        while todo:
            cls = todo.pop()
            ForkingPickler.register(cls, reducer)
            todo += cls.__subclasses__()


init_reductions()
