"""torch's top-level names on NumPy: ``torch.zeros``, ``torch.float32``, ``torch.tensor``, ...

``import mpviz`` does not load this module: the first use of one of these names does (see
mpviz/__init__.py), so that ``python -m mpviz trace`` and a child that only needs
``mpviz.multiprocessing``'s plumbing do not pay for NumPy (~0.1 s) before their first line.
"""
import numpy as np

from .random import manual_seed
from .storage import Storage
from .tensor import (Size, Tensor, bool_, check_dtype, float16, float32, float64, int8, int16,
                     int32, int64, uint8)
from . import random as _random
from .autograd import no_grad, enable_grad, is_grad_enabled

half, float, double, long, int = float16, float32, float64, int64, int32  # torch's aliases
bool = bool_
UntypedStorage = Storage


def _dtype(dtype, default):
    return check_dtype(default if dtype is None else dtype)


def _shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    for n in size:
        if not isinstance(n, (type(1), np.integer)) or n < 0:
            raise ValueError(f"sizes must be non-negative ints, got {size!r}")
    return tuple(size)


_MAX_BYTES = np.iinfo(np.intp).max      # the most bytes one NumPy array can span


def _sized(size, dtype, call):
    """The shape `size` names, refused (what, why, fix) when the tensor could not exist: more
    bytes than one array can span. `call` names the call in the message ("zeros")."""
    shape = _shape(size)
    dt = np.dtype(dtype)
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * dt.itemsize
    if nbytes > _MAX_BYTES:
        raise ValueError(
            f"mpviz.{call}({', '.join(map(str, shape))}): {numel:,} elements of {dt.name} would be {nbytes:,} bytes, "
            f"more than any array can span ({_MAX_BYTES:,} bytes: NumPy's 'array is too big'). "
            f"Fix: check the sizes -- each is a number of elements, not of bytes, and a shape "
            f"(a, b) holds a*b of them.")
    return shape


def _allocate(make, size, dtype, call):
    """``make(shape, dtype)`` for a new tensor of `size`; a MemoryError that says how much was
    asked for and what to do (NumPy's own words kept inside)."""
    shape = _sized(size, dtype, call)
    try:
        return make(shape, dtype)
    except MemoryError as exc:
        nbytes = np.dtype(dtype).itemsize
        for n in shape:
            nbytes *= n
        raise MemoryError(
            f"mpviz.{call}({', '.join(map(str, shape))}): {nbytes / 2**30:,.1f} GiB ({nbytes:,} bytes) could not be "
            f"allocated on this machine ({exc}). Fix: a smaller tensor, or process the data in "
            f"pieces.") from None


def tensor(data, dtype=None, device="cpu", requires_grad=False):
    """A new tensor holding a copy of `data` (nested lists, numbers, arrays or a tensor)."""
    if isinstance(data, Tensor):
        data = data.__array__()
    array = np.array(data, dtype=None if dtype is None else check_dtype(dtype))
    if dtype is None and array.dtype.kind == "f":
        array = array.astype(float32)  # torch's default float type
    elif dtype is None and array.dtype.kind in "OUS":
        check_dtype(array.dtype, "mpviz.tensor(data)")
    return Tensor._wrap(array, device, requires_grad)


def from_numpy(array):
    """A tensor that shares `array`'s memory (no copy), as torch.from_numpy."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, not {type(array).__name__}")
    dt = check_dtype(array.dtype, "from_numpy(array)")
    base = array
    while isinstance(base.base, np.ndarray):
        base = base.base
    if not base.flags.c_contiguous:
        base = array
    flat = base.reshape(-1).view(np.uint8) if base.flags.c_contiguous else None
    if flat is None or not array.flags.writeable or flat.size == 0:
        return Tensor._wrap(array.copy())   # (an empty array has no memory to share: a copy is it)
    storage = Storage(_data=flat)
    t = Tensor(storage, 0, (), (), dt)
    view = t._as_view(array)
    return view if view is not None else Tensor._wrap(array.copy())


def zeros(*size, dtype=None, device="cpu", requires_grad=False):
    return Tensor._wrap(_allocate(np.zeros, size, _dtype(dtype, float32), "zeros"), device,
                        requires_grad)


def ones(*size, dtype=None, device="cpu", requires_grad=False):
    return Tensor._wrap(_allocate(np.ones, size, _dtype(dtype, float32), "ones"), device,
                        requires_grad)


def empty(*size, dtype=None, device="cpu", requires_grad=False):
    return Tensor._wrap(_allocate(np.empty, size, _dtype(dtype, float32), "empty"), device,
                        requires_grad)


def full(size, fill_value, dtype=None, device="cpu", requires_grad=False):
    array = _allocate(lambda shape, dt: np.full(shape, fill_value, dt), (size,),
                      _dtype(dtype, float32), "full")
    return Tensor._wrap(array, device, requires_grad)


def randn(*size, dtype=None, device="cpu", requires_grad=False):
    values = _random.generator().standard_normal(_sized(size, _dtype(dtype, float32), "randn"))
    return Tensor._wrap(values.astype(_dtype(dtype, float32)), device, requires_grad)


def rand(*size, dtype=None, device="cpu", requires_grad=False):
    values = _random.generator().random(_sized(size, _dtype(dtype, float32), "rand"))
    return Tensor._wrap(values.astype(_dtype(dtype, float32)), device, requires_grad)


def randint(low, high=None, size=(), dtype=None, device="cpu"):
    if high is None:
        low, high = 0, low
    values = _random.generator().integers(low, high, size=_shape((size,)))
    return Tensor._wrap(values.astype(_dtype(dtype, int64)), device)


def arange(start, end=None, step=1, dtype=None, device="cpu", requires_grad=False):
    if end is None:
        start, end = 0, start
    values = np.arange(start, end, step)
    if dtype is None:
        dtype = float32 if values.dtype.kind == "f" else int64
    return Tensor._wrap(values.astype(check_dtype(dtype)), device, requires_grad)


def zeros_like(t, dtype=None):
    return zeros(*t.shape, dtype=dtype or t.dtype, device=t.device)


def ones_like(t, dtype=None):
    return ones(*t.shape, dtype=dtype or t.dtype, device=t.device)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def stack(tensors, dim=0):
    return Tensor._wrap(np.stack([t.__array__() for t in tensors], axis=dim), tensors[0].device)


def cat(tensors, dim=0):
    return Tensor._wrap(np.concatenate([t.__array__() for t in tensors], axis=dim), tensors[0].device)
