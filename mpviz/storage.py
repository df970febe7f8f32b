"""A Storage is the bytes; a Tensor is a way of looking at them.

::

    Tensor a  (shape 4x4, offset 0)  ─┐
    Tensor b = a[1:3]  (offset 4)     ├──▶  Storage (16 floats)  ──▶  where the bytes live:
    Tensor c = a[:, 0] (stride 4)    ─┘                                heap | file_descriptor
                                                                       | file_system | cuda

Everything about sharing happens to the Storage, never to a Tensor:

* ``share_memory_()`` allocates a shared segment, copies the bytes into it and **swaps the
  storage's buffer in place**. Every tensor that looks at this storage — made before or after —
  now sees the shared bytes, because tensors find their bytes through the storage each time.
* When a storage is sent to another process, only a small handle travels
  (:mod:`mpviz.multiprocessing.reductions`); the receiver maps the same memory.

Adapted from torch's ``UntypedStorage`` (``share_memory_`` calls ``set_data_ptr`` on the same
StorageImpl, so ``_cdata`` stays and ``data_ptr()`` changes). Left out: typed storages, and the
resizable-after-sharing bug (torch segfaults on ``resize_`` of a shared storage; mpviz refuses).
"""
import threading
from multiprocessing.reduction import ForkingPickler

import numpy as np

from . import sharing
from .errors import SharingError
from .trace import recorder

_share_lock = threading.Lock()


class Storage:
    """A flat array of bytes that tensors view. Knows where it lives (:attr:`location`)."""

    def __init__(self, nbytes=0, *, _data=None, _segment=None, _device="cpu"):
        if _segment is not None:
            self._segment = _segment
            self._data = _segment.array
        else:
            if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
                raise ValueError(f"nbytes must be a non-negative int, not {nbytes!r}")
            self._segment = None
            self._data = _data if _data is not None else np.zeros(int(nbytes), dtype=np.uint8)
        self.device = _device
        self.version = 0          # bumped whenever the buffer is swapped; tensors re-derive views
        self._sent_from = None    # the pid of the process this came from, if received

    @property
    def _received(self):
        """True for storages rebuilt from another process's handle."""
        return self._sent_from is not None

    # -- what the bytes are, and where ----------------------------------------------------------

    @property
    def data(self):
        """The bytes, as a 1-D uint8 NumPy array (a view: no copy)."""
        return self._data

    def nbytes(self):
        return self._data.shape[0]

    def size(self):
        return self.nbytes()

    __len__ = nbytes

    @property
    def location(self):
        """'heap' (this process's private memory), 'file_descriptor', 'file_system' or 'cuda'."""
        return self._segment.strategy if self._segment is not None else "heap"

    @property
    def segment_name(self):
        """The shared segment's name (for file_descriptor, the name it had before it was unlinked)."""
        return getattr(self._segment, "name", None)

    def data_ptr(self):
        return self._data.__array_interface__["data"][0]

    def is_shared(self):
        return self._segment is not None

    def view_as(self, dtype, offset, shape, strides):
        """A NumPy view of these bytes as `dtype`, at byte `offset`, with byte `strides`."""
        return np.ndarray(shape, dtype, buffer=self._data, offset=offset, strides=strides)

    def offset_of(self, array):
        """Byte offset of `array`'s first element in this storage, or None if it lies elsewhere."""
        start = self.data_ptr()
        ptr = array.__array_interface__["data"][0]
        if start <= ptr < start + max(self.nbytes(), 1) or (array.size == 0 and ptr == start):
            return ptr - start
        return None

    # -- sharing --------------------------------------------------------------------------------

    def share_memory_(self, strategy=None):
        """Move the bytes into shared memory **in place** and return self (no-op if already shared)."""
        if self._segment is not None:
            return self
        strategy = strategy or sharing.get_sharing_strategy()
        with _share_lock:
            if self._segment is not None:  # another thread shared it meanwhile
                return self
            segment = sharing.allocate(self.nbytes(), strategy, self._data)  # a copy of the bytes
            if recorder.ENABLED:
                recorder.emit("copy", nbytes=self.nbytes(), name=segment.name, strategy=strategy)
            self._segment = segment
            self._data = segment.array
            self.version += 1
        return self

    def resize_(self, nbytes):
        """Grow or shrink a private storage. Shared storages cannot be resized (other processes map them)."""
        if self._segment is not None:
            raise SharingError(
                f"cannot resize a shared storage ({self.location}, {self.nbytes()} bytes): other "
                f"processes may map these exact bytes, and a new size would need new memory they "
                f"cannot see (torch segfaults here). Fix: make a new tensor of the size you need "
                f"and share that, e.g. mpviz.zeros(n).share_memory_().")
        new = np.zeros(int(nbytes), dtype=np.uint8)
        n = min(int(nbytes), self.nbytes())
        new[:n] = self._data[:n]
        self._data = new
        self.version += 1
        return self

    def __init_subclass__(cls, **kwargs):
        # Subclasses (CudaStorage) are sent as a Storage is: reductions.reduce_storage decides.
        super().__init_subclass__(**kwargs)
        send_as_base(cls, Storage)

    # -- copies ---------------------------------------------------------------------------------

    def clone(self):
        return Storage(_data=self._data.copy())

    def tolist(self):
        return self._data.tolist()

    def __reduce__(self):
        # Plain pickle (not ForkingPickler) copies the bytes, as torch's does.
        return (_storage_from_bytes, (self._data.tobytes(),))

    def __repr__(self):
        return f"<mpviz.Storage {self.nbytes()} bytes in {self.location}>"


def _storage_from_bytes(data):
    return Storage(_data=np.frombuffer(bytearray(data), dtype=np.uint8))


def reduce_on_first_send(obj):
    """The reducer of a Storage or Tensor pickled by multiprocessing before
    mpviz.multiprocessing.reductions is loaded (a program that sends tensors through the
    stdlib's Queue, Pipe or Process arguments, and never imported mpviz.multiprocessing).
    Importing reductions runs its ``init_reductions()``, the one place mpviz's reducers are
    registered, in this one's place, for every class: so this runs once per process at most."""
    from .multiprocessing import reductions  # noqa: F401  (importing it registers them all)
    return ForkingPickler._extra_reducers[type(obj)](obj)


def send_as_base(cls, base):
    """Make multiprocessing's pickler send instances of `cls`, a subclass of `base`, as it sends
    a `base` (it looks reducers up by exact type): called by the classes' ``__init_subclass__``."""
    ForkingPickler.register(cls, ForkingPickler._extra_reducers[base])


ForkingPickler.register(Storage, reduce_on_first_send)
# Every ForkingPickler pickling becomes a scope that gives back what its handles took if it fails
# half-way (a Pipe's send((t, lambda: 0)), say): installed now, before any storage can be sent.
sharing.handles.install()
