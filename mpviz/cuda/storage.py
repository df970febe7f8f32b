"""CudaStorage: a Storage whose bytes are a device block (the producer's) or a mapping of one.

::

    Tensor ──▶ CudaStorage ──▶ ._mem: Block    (this process allocated it: cudaMalloc)
                                  or  Mapping  (another process's block, opened from its handle)

It answers the same questions as :class:`mpviz.storage.Storage` — views, offsets, pointer,
``is_shared`` — so :class:`mpviz.tensor.Tensor` needs no CUDA code of its own. What differs:

* ``is_shared()`` is always True and ``share_memory_()`` does nothing: device memory is
  shared through CUDA IPC handles, never moved into /dev/shm (torch: the same).
* Sending it on its own is refused (torch: "Cannot pickle CUDA storage; try pickling a CUDA tensor
  instead"); a CUDA *tensor* travels as a handle (:mod:`mpviz.cuda.ipc`). Plain ``pickle`` copies
  the bytes through the host, as ``torch.save`` does.
"""
import numpy as np

from ..storage import Storage
from . import backends


class CudaStorage(Storage):
    """Device bytes. ``_mem`` is the backend's Block (owned) or Mapping (received)."""

    def __init__(self, mem, *, producer_pid=None):
        super().__init__(_data=mem.bytes, _device=f"cuda:{mem.device_index}")
        self._mem = mem
        self._sent_from = producer_pid

    @property
    def location(self):
        return "cuda"

    @property
    def segment_name(self):
        return self._mem.name

    @property
    def block(self):
        """The block's name: what recorder events and :func:`mpviz.cuda.memory_stats` call it."""
        return self._mem.name

    def nbytes(self):
        return self._mem.nbytes

    __len__ = nbytes

    def size(self):
        return self._mem.nbytes

    def data_ptr(self):
        return self._mem.data_ptr()

    def is_shared(self):
        return True

    def share_memory_(self, strategy=None):
        return self  # a no-op for CUDA, as in torch

    def view_as(self, dtype, offset, shape, strides):
        return self._mem.view_as(dtype, offset, shape, strides)

    def offset_of(self, array):
        return self._mem.offset_of(array)

    def resize_(self, nbytes):
        raise RuntimeError(
            f"cannot resize a CUDA storage ({self.nbytes()} bytes): other processes may hold CUDA "
            f"IPC handles to this exact block. Fix: make a new tensor of the size you need.")

    def clone(self):
        # (lazily: mpviz.cuda imports this module; its to_device_bytes picks the device, allocates)
        from . import to_device_bytes
        return to_device_bytes(self._host_bytes(), self.device)

    def _host_bytes(self):
        return np.asarray(backends.of(self).to_numpy(self._mem.bytes), dtype=np.uint8)

    def tolist(self):
        return self._host_bytes().tolist()

    def __reduce__(self):
        # Plain pickle: copy the bytes through the host and put them back on a device (torch.save).
        return (_storage_from_host_bytes, (self._host_bytes().tobytes(), self.device))

    def __repr__(self):
        how = f"received from pid {self._sent_from}" if self._received else "allocated here"
        return f"<mpviz.CudaStorage {self.nbytes()} bytes on {self.device}, block {self.block}, {how}>"


def _storage_from_host_bytes(data, device):
    from . import to_device_bytes
    return to_device_bytes(np.frombuffer(bytearray(data), dtype=np.uint8), device)
