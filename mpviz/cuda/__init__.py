"""mpviz.cuda: CUDA tensors, and how they are shared between processes (CUDA IPC).

On a machine with an NVIDIA GPU and CuPy, ``.cuda()`` puts a tensor in real device memory. Without
one — the usual case in a workshop — it uses the **CUDA IPC simulator**, and says so once on
stderr. Both backends follow the same lifetime rules, enforced by the same code::

    mpviz.cuda  (this file: the API; the backend is chosen once per process)
      │
      ├── ipc.py        the rules: reference counts per sent block, limbo, ipc_collect,
      │                 the producer-exit warning, the re-send / same-queue / fork errors
      ├── refcount.py   the counters: one shared file of int64 slots per producer
      ├── storage.py    CudaStorage: a Storage whose bytes are a device block or a mapping of one
      ├── errors.py     what is raised, and what to do instead
      └── backends.py   which backend, chosen once per process, looked up by name:
            cupy_backend.py   cudaMalloc / cudaIpcGetMemHandle / cudaIpcOpenMemHandle via CuPy
            simulator.py      the same on shared memory, with poison where a GPU would fault

What you can look at: :func:`memory_stats` (this process's blocks, their reference counts, what
waits in limbo), :func:`ipc_info` (one tensor's block), the recorder's ``cuda.alloc``,
``cuda.send``, ``cuda.ipc_open``, ``cuda.ipc_close``, ``cuda.limbo``, ``cuda.free``,
``cuda.warning`` events, and how a tensor travels: :func:`reduce_tensor`.

Adapted from ``torch.cuda`` (``is_available``, ``device_count``, ``ipc_collect``) and
``torch/multiprocessing/reductions.py`` (``reduce_tensor``'s CUDA branch, ``rebuild_cuda_tensor``).
Left out: streams and the caching allocator (each storage is one block), memory pools.
"""
import os
import sys

import numpy as np

from ..tensor import Tensor, _contiguous_strides
from . import backends, ipc, simulator
from .errors import (CudaForkError, CudaHandleInvalidError, CudaResendError,  # noqa: F401
                     CudaSameProcessError)
from .storage import CudaStorage

__all__ = ["is_available", "is_initialized", "backend", "device_count", "current_device", "get_device_name",
           "ipc_collect", "memory_stats", "ipc_info", "synchronize", "why_simulator",
           "CudaStorage", "CudaResendError", "CudaSameProcessError", "CudaHandleInvalidError",
           "CudaForkError"]

_ENV_BACKEND = backends.ENV                  # "cupy", "simulator", or unset: choose
_ENV_NOTICE = "MPVIZ_CUDA_SIMULATOR_NOTICE"  # set once the simulator's notice was printed
_choose = backends.choose                    # the backend, chosen once (backends.py)
_select = backends.select                    # for tests: switch this process's backend


def backend():
    """``"cupy"`` (a real GPU) or ``"simulator"``."""
    return _choose().NAME


def is_available():
    """True only when a real GPU is used (through CuPy). The simulator does not count."""
    return backend() == "cupy"


def why_simulator():
    """Why this process uses the simulator (None when it uses a GPU)."""
    _choose()
    return backends.reason if backends.chosen is simulator else None


def is_initialized():
    """True once this process has used CUDA (made a CUDA tensor or received one); False in a
    forked child until it does (it may not: see CudaForkError), as ``torch.cuda.is_initialized``."""
    return ipc.is_initialized()


def device_count():
    return _choose().device_count()


def current_device():
    return 0


def get_device_name(device=0):
    return _choose().device_name(_device_index(device))


def synchronize():
    """Wait for the device to finish queued work (a no-op in the simulator)."""
    if _choose().NAME == "cupy":
        import cupy
        cupy.cuda.runtime.deviceSynchronize()


def _device_index(device):
    if isinstance(device, int):
        index = device
    else:
        text = str(device)
        if text == "cuda":
            index = 0
        elif text.startswith("cuda:") and text[5:].isdigit():
            index = int(text[5:])
        else:
            raise ValueError(f"device must be 'cuda', 'cuda:N' or an int, not {device!r}")
    n = device_count()
    if not 0 <= index < n:
        raise ValueError(f"device {device!r} does not exist: this {backend()} backend has {n} "
                         f"device(s), cuda:0 to cuda:{n - 1}")
    return index


def _notice(chosen):
    if chosen is simulator and not os.environ.get(_ENV_NOTICE):
        os.environ[_ENV_NOTICE] = "shown"  # children started from now on stay quiet too
        print(f"[mpviz.cuda] no GPU here ({backends.reason}): .cuda() uses the CUDA IPC simulator - device "
              f"memory is shared memory in /dev/shm, with real IPC handles, reference counts and "
              f"CUDA's lifetime rules.", file=sys.stderr, flush=True)


# -- moving tensors (the hooks mpviz.tensor calls) --------------------------------------------------

def to_device_bytes(host_bytes, device="cuda"):
    """A new CudaStorage holding a copy of the 1-D uint8 array `host_bytes`."""
    chosen = _choose()
    index = _device_index(device)
    _notice(chosen)
    storage = ipc.allocate(chosen, int(host_bytes.shape[0]), index)
    if host_bytes.shape[0]:
        storage._mem.upload(host_bytes)
    return storage


def to_device(tensor, device="cuda"):
    """A copy of CPU `tensor` in device memory (``Tensor.cuda()``, ``.to("cuda")``)."""
    host = np.array(tensor._np, copy=True, order="C")
    storage = to_device_bytes(host.reshape(-1).view(np.uint8), device)
    out = Tensor.__new__(type(tensor))
    Tensor.__init__(out, storage, 0, host.shape, _contiguous_strides(host.shape), host.dtype,
                    tensor.requires_grad)
    return out


def to_host(tensor):
    """A copy of CUDA `tensor` in host memory (``Tensor.cpu()``)."""
    array = backends.of(tensor._storage).to_numpy(tensor._np)
    return Tensor._wrap(np.asarray(array), requires_grad=tensor.requires_grad)


# -- sending (reduce directly above rebuild, as in torch's reductions.py) ---------------------------

def reduce_tensor(tensor):
    """Pickle a CUDA tensor as a handle to its producer's block, counted in the producer's slot.

    How a CUDA tensor travels (``q.put(x)`` in the producer, ``y = q.get()`` in a consumer)::
    
        reduce_tensor(x)  ─▶ (rebuild_cuda_tensor, (class, handle, offset, shape, strides, dtype, …))
                              handle = (backend, IPC handle, block name, nbytes, device,
                                        producer pid, counter file, slot, event handle)
        rebuild_cuda_tensor ─▶ opens the handle (or finds the block already open here), and holds
                              one count in the producer's slot until the tensor dies"""
    handle = ipc.share(tensor._storage)  # raises CudaResendError for a received tensor
    return (rebuild_cuda_tensor, (type(tensor), handle, tensor._offset, tensor._shape,
                                  tensor._strides, tensor.dtype.str, tensor.requires_grad, tensor.grad))


def rebuild_cuda_tensor(cls, handle, offset, shape, strides, dtype, requires_grad, grad):
    storage = ipc.rebuild(backends.by_name(handle[0]), *handle[1:])
    tensor = Tensor.__new__(cls)
    Tensor.__init__(tensor, storage, offset, shape, strides, dtype, requires_grad)
    tensor.grad = grad
    return tensor


# -- collecting and looking --------------------------------------------------------------------------

def ipc_collect():
    """Free the blocks in limbo that no consumer holds any more (torch.cuda.ipc_collect).

    Returns how many blocks were freed.
    """
    return ipc.collect()


def memory_stats():
    """This process's CUDA IPC state: the blocks it allocated (state live/limbo, reference count,
    how many times sent), the blocks it holds from other processes (valid or poisoned), and totals.
    """
    stats = ipc.stats()
    stats["backend"] = backends.chosen.NAME if backends.chosen is not None else None
    return stats


def ipc_info(tensor):
    """One CUDA tensor's block: its name, owner, reference count, and whether it is still valid."""
    if not tensor.is_cuda:
        raise TypeError("ipc_info needs a CUDA tensor: call .cuda() first")
    storage = tensor._storage
    stats = ipc.stats()
    for key, role in (("allocated", "producer"), ("received", "consumer")):
        for b in stats[key]:
            if b["block"] == storage.block:
                info = dict(b, role=role)
                info.setdefault("producer", os.getpid())
                info.setdefault("valid", b.get("state") in ("live", "limbo"))
                return info
    return {"block": storage.block, "role": "released", "valid": False}
