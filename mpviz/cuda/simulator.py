"""The CUDA IPC simulator: "device memory" that is shared memory, with real handles across processes.

Used when there is no GPU. It is not a mock of the rules inside one process: every block is a
real shared-memory object, the handle really opens it in another process, and freeing it really
breaks what other processes see — the effect that makes CUDA IPC's lifetime rules necessary::

    producer                                            consumer
    ─────────                                           ─────────
    allocate(n)  = cudaMalloc                           open(handle) = cudaIpcOpenMemHandle
      shm_open("/mpviz_cuda_<pid>_<rand>", O_EXCL)        shm_open(handle), mmap, close fd
      mmap, close fd                                      ──▶ the same bytes, zero copy
    handle       = cudaIpcGetMemHandle: the name        close()      = cudaIpcCloseMemHandle
    free()       = cudaFree:                              drops the mapping
      fill the bytes with 0xFF ("poison")
      mark the header FREED, shm_unlink the name  ──▶  a consumer still mapping it now reads
                                                        NaN (floats) / -1 (signed ints) / 255
                                                        and a later open() fails: no such handle

    block layout:  [ 64-byte header: b"MPVZCUDA", state, producer pid, nbytes ][ the bytes ... ]

Adapted from the CUDA runtime's IPC API (``cudaIpcGetMemHandle`` / ``cudaIpcOpenMemHandle`` /
``cudaIpcCloseMemHandle``). Simplified: one simulated device unless ``MPVIZ_SIM_DEVICES`` says
more; no streams, so no interprocess events are needed (``record_event`` returns None).
"""
import os
import secrets
import struct

import numpy as np

from ..errors import SharedMemoryFullError
from ..sharing import file_system, shm_manager
from ..sharing.segment import reserve
from .refcount import map_shared  # unmapped on collection, never by interpreter shutdown

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

NAME = "simulator"
PREFIX = file_system.PREFIX + "cuda_"   # /mpviz_<MPVIZ_SHM_TAG>cuda_, tagged like every segment
HEADER = struct.Struct("=8sqqq")  # magic, state, producer pid, nbytes
HEADER_SIZE = 64                  # keeps the data 64-byte aligned, like a cudaMalloc block
MAGIC = b"MPVZCUDA"
LIVE, FREED = 1, 2
POISON = 0xFF                     # every float is NaN, every signed int is -1


def is_real():
    return False


MAX_DEVICES = 64


def device_count():
    """How many devices the simulator has: ``MPVIZ_SIM_DEVICES`` (default 1), a whole number
    from 1 to MAX_DEVICES; anything else is refused, naming the variable."""
    text = os.environ.get("MPVIZ_SIM_DEVICES", "1")
    try:
        n = int(text.strip())
    except ValueError:
        n = None
    if n is None or not 1 <= n <= MAX_DEVICES:
        why = ("is not a whole number" if n is None else
               "would leave the simulator with no device: every .cuda() would fail"
               if n < 1 else f"is more than {MAX_DEVICES}")
        raise ValueError(f"MPVIZ_SIM_DEVICES={text!r} {why}. It says how many devices "
                         f"mpviz's CUDA simulator has (cuda:0 ... cuda:N-1). Fix: "
                         f"MPVIZ_SIM_DEVICES=2 (a number from 1 to {MAX_DEVICES}), or unset it "
                         f"for one device.")
    return n


def device_name(index):
    return f"mpviz simulated device {index} (shared memory in /dev/shm)"


class _Memory:
    """What a block and a mapping have in common: bytes that tensors view."""

    backend = NAME

    def view_as(self, dtype, offset, shape, strides):
        return np.ndarray(shape, dtype, buffer=self.bytes, offset=offset, strides=strides)

    def offset_of(self, array):
        start = self.data_ptr()
        ptr = array.__array_interface__["data"][0]
        if start <= ptr < start + max(self.nbytes, 1) or (array.size == 0 and ptr == start):
            return ptr - start
        return None

    def data_ptr(self):
        return self.bytes.__array_interface__["data"][0]

    def upload(self, host_bytes):
        self.bytes[:] = host_bytes

    def state(self):
        return HEADER.unpack_from(self._buf, 0)[1]

    def is_valid(self):
        """False once the producer has freed the block (its bytes are poison now)."""
        return self.state() == LIVE


class Block(_Memory):
    """A block this process allocated (``cudaMalloc``). Its `name` is its IPC handle.

    Each block is also reported to the :mod:`~mpviz.sharing.shm_manager`, so that a producer killed
    by SIGKILL (which frees nothing) leaves nothing in /dev/shm for long. Such a block is unlinked
    but not poisoned: a consumer's mapping keeps the last values (the one thing a GPU would not
    do)."""

    def __init__(self, nbytes, device_index):
        self.nbytes = nbytes
        self.device_index = device_index
        self.name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        size = HEADER_SIZE + max(nbytes, 1)
        shm_manager.client().hold(self.name)  # tell the manager first: if we die now, it knows
        fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            try:
                reserve(fd, size, "cuda")
            except SharedMemoryFullError:
                raise MemoryError(
                    f"CUDA out of memory (simulated): cannot allocate {nbytes:,} bytes of "
                    f"simulated device memory, because /dev/shm is full. The simulator keeps "
                    f"device memory in /dev/shm (`df -h /dev/shm`; Docker's default is 64 MiB). "
                    f"Fix: use smaller tensors, free what you no longer need (del, then "
                    f"mpviz.cuda.ipc_collect()), or give the container more /dev/shm.") from None
            self._buf = map_shared(fd, size)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(self.name)
            shm_manager.client().drop(self.name)
            raise
        os.close(fd)  # like a file_system segment: the name is the handle, no descriptor kept
        HEADER.pack_into(self._buf, 0, MAGIC, LIVE, os.getpid(), nbytes)
        self.bytes = np.frombuffer(self._buf, dtype=np.uint8, count=nbytes, offset=HEADER_SIZE)

    def export(self):
        """The IPC handle another process opens (``cudaIpcGetMemHandle``)."""
        return self.name

    def free(self):
        """``cudaFree``: poison the bytes, mark the block freed, remove its name.

        Why poison: on a real GPU a consumer's mapping of freed memory is undefined behaviour —
        torch's caching allocator hands the block to the producer's next tensor, so the consumer
        silently reads someone else's numbers, or the driver faults. The simulator makes that
        visible instead of silent."""
        self.bytes.fill(POISON)
        HEADER.pack_into(self._buf, 0, MAGIC, FREED, os.getpid(), self.nbytes)
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass  # the shm manager got there first
        shm_manager.client().unlinked(self.name)
        shm_manager.client().drop(self.name)


class Mapping(_Memory):
    """Another process's block, opened from its handle (``cudaIpcOpenMemHandle``)."""

    def __init__(self, handle, nbytes, device_index):
        self.name = handle
        self.nbytes = nbytes
        self.device_index = device_index
        size = HEADER_SIZE + max(nbytes, 1)
        fd = _posixshmem.shm_open(handle, os.O_RDWR, 0o600)  # FileNotFoundError: freed already
        try:
            self._buf = map_shared(fd, size)
        finally:
            os.close(fd)
        magic, state, _, _ = HEADER.unpack_from(self._buf, 0)
        if magic != MAGIC or state != LIVE:
            raise FileNotFoundError(2, f"simulated CUDA block {handle} has been freed")
        self.bytes = np.frombuffer(self._buf, dtype=np.uint8, count=nbytes, offset=HEADER_SIZE)

    def close(self):
        """``cudaIpcCloseMemHandle``. The pages are unmapped when the last NumPy view is gone."""
        self.bytes = None
        self._buf = None
        self._closed = True

    def is_valid(self):
        return not getattr(self, "_closed", False) and self.state() == LIVE


def allocate(nbytes, device_index):
    return Block(nbytes, device_index)


def open_handle(handle, nbytes, device_index, name=None):
    return Mapping(handle, nbytes, device_index)


def record_event(block):
    """No streams in the simulator: writes are visible at once, so there is nothing to wait for."""
    return None


def wait_event(event_handle):
    pass


def to_numpy(array):
    return np.array(array, copy=True)
