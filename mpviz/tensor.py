"""Tensor: a view (offset, shape, strides, dtype) on a Storage, computing with NumPy.

A tensor does not own bytes. It remembers *which* storage and *how to look at it*::

    t = mpviz.arange(12.).reshape(3, 4)     storage: [0 1 2 3 4 5 6 7 8 9 10 11]
    v = t[1:, ::2]                          offset 4, shape (2, 2), strides (4, 2)
                                                        ^           ^ in elements, as torch

Each time a tensor is used it builds a NumPy view over its storage's *current* buffer. So when
``share_memory_()`` swaps the storage's buffer for shared memory, every tensor on that storage
follows — the in-place move that makes ``Queue.put`` cheap the second time.

Basic slicing gives views that share the storage; advanced indexing (lists, masks) copies, as in
NumPy and torch. Arithmetic lives in :mod:`mpviz.autograd`, which also records how to take
gradients; this module is only about bytes, views and devices.
"""
from multiprocessing.reduction import ForkingPickler

import numpy as np

from . import random
from .storage import Storage, reduce_on_first_send, send_as_base

float16, float32, float64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
int8, int16, int32, int64 = np.dtype("int8"), np.dtype("int16"), np.dtype("int32"), np.dtype("int64")
uint8, bool_ = np.dtype("uint8"), np.dtype("bool")


class Size(tuple):
    """A tensor's shape: a tuple that prints like torch's ``torch.Size([2, 3])``."""

    def __repr__(self):
        return f"mpviz.Size({list(self)})"

    def numel(self):
        return int(np.prod(self, dtype=np.int64))


def check_dtype(dtype, what="a tensor"):
    """Return `dtype` as a NumPy dtype if tensors can hold it; else say why not."""
    dt = np.dtype(dtype)
    if dt.kind not in "biufc":
        raise TypeError(
            f"{what} cannot have dtype {dt} ({dt.kind!r} kind): mpviz tensors hold numbers only. "
            f"Objects and strings are stored as pointers into one process's heap, so their bytes "
            f"mean nothing in shared memory or in another process. Fix: convert to a numeric "
            f"array first (e.g. np.asarray(x, dtype=np.float32)), or send Python objects as "
            f"ordinary queue items.")
    return dt


class Tensor:
    """A strided view on a :class:`~mpviz.storage.Storage`. See the module docstring."""

    __array_priority__ = 1000  # NumPy defers to our operators (ndarray + Tensor -> Tensor)

    def __init__(self, storage, offset, shape, strides, dtype, requires_grad=False):
        self._storage = storage
        self._offset = offset          # in elements
        self._shape = tuple(shape)
        self._strides = tuple(strides)  # in elements
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._grad_fn = None           # set by mpviz.autograd for results of differentiable ops
        self._view_cache = None        # (storage.version, ndarray)

    def __init_subclass__(cls, **kwargs):
        # Subclasses (nn.Parameter, ...) cross processes as handles too, sent as a Tensor is.
        super().__init_subclass__(**kwargs)
        send_as_base(cls, Tensor)

    def __getstate__(self):
        # Plain pickle (not multiprocessing's): copy the bytes, drop the cached view and the graph.
        state = dict(self.__dict__)
        state["_view_cache"] = None
        state["_grad_fn"] = None
        return state

    # -- making tensors -------------------------------------------------------------------------

    @classmethod
    def _wrap(cls, array, device="cpu", requires_grad=False):
        """A new tensor that owns a private copy of `array`'s values (C order)."""
        if not isinstance(array, np.ndarray) and hasattr(array, "get"):
            array = array.get()  # a CuPy array (an op on a real GPU): bring it to the host first
        array = np.asarray(array)
        dt = check_dtype(array.dtype)
        if device != "cpu":
            from . import cuda
            result = cuda.to_device(cls._wrap(array), device)
            result.requires_grad = bool(requires_grad)
            return result
        flat = np.ascontiguousarray(array)
        if flat is array and (array.base is not None or not array.flags.owndata):
            flat = array.copy()
        storage = Storage(_data=flat.reshape(-1).view(np.uint8))
        return cls(storage, 0, array.shape, _contiguous_strides(array.shape), dt, requires_grad)

    # -- the NumPy view -------------------------------------------------------------------------

    @property
    def _np(self):
        """This tensor's elements as a NumPy view on the storage's current buffer (no copy)."""
        cache = self._view_cache
        storage = self._storage
        if cache is not None and cache[0] == storage.version:
            return cache[1]
        item = self.dtype.itemsize
        array = storage.view_as(self.dtype, self._offset * item, self._shape,
                                tuple(s * item for s in self._strides))
        self._view_cache = (storage.version, array)
        return array

    def numpy(self):
        """The elements as a NumPy array sharing this tensor's memory (CPU only, no grad)."""
        if self.is_cuda:
            raise TypeError("can't convert a cuda tensor to numpy: call .cpu() first (it copies to host memory)")
        if self.requires_grad:
            raise RuntimeError("can't call numpy() on a tensor that requires grad: use t.detach().numpy()")
        return self._np

    def __array__(self, dtype=None, copy=None):
        a = self._np if not self.is_cuda else self.cpu()._np
        if dtype is not None:
            return a.astype(dtype)
        return a.copy() if copy else a

    # -- shape and memory -----------------------------------------------------------------------

    @property
    def shape(self):
        return Size(self._shape)

    def size(self, dim=None):
        return Size(self._shape) if dim is None else self._shape[dim]

    def dim(self):
        return len(self._shape)

    ndim = property(dim)

    def numel(self):
        return int(np.prod(self._shape, dtype=np.int64))

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def storage_offset(self):
        return self._offset

    def untyped_storage(self):
        return self._storage

    storage = untyped_storage

    def data_ptr(self):
        return self._storage.data_ptr() + self._offset * self.dtype.itemsize

    def element_size(self):
        return self.dtype.itemsize

    def is_contiguous(self):
        return self._strides == _contiguous_strides(self._shape)

    @property
    def device(self):
        return self._storage.device

    @property
    def is_cuda(self):
        return self._storage.device != "cpu"

    # -- sharing --------------------------------------------------------------------------------

    def share_memory_(self):
        """Move the underlying storage into shared memory, in place; a no-op if shared or CUDA."""
        if not self.is_cuda:
            self._storage.share_memory_()  # only the data, as torch: Module.share_memory() also shares grads
        return self

    def is_shared(self):
        return self.is_cuda or self._storage.is_shared()

    # -- views ----------------------------------------------------------------------------------

    def __getitem__(self, index):
        if isinstance(index, Tensor):
            index = index._np
        elif isinstance(index, tuple):
            index = tuple(i._np if isinstance(i, Tensor) else i for i in index)
        result = self._np[index]
        view = self._as_view(result)
        if view is None:  # advanced indexing made a copy
            view = Tensor._wrap(result, self.device)
        if self.requires_grad:
            from . import autograd
            autograd.track_getitem(view, self, index)
        return view

    def __setitem__(self, index, value):
        if isinstance(index, Tensor):
            index = index._np
        elif isinstance(index, tuple):
            index = tuple(i._np if isinstance(i, Tensor) else i for i in index)
        self._np[index] = value._np if isinstance(value, Tensor) else value

    def _as_view(self, array):
        """The Tensor for `array` if it is a view into our storage, else None.

        `array` is what indexing our ``_np`` gave: a NumPy array on the host, a CuPy array on a GPU.
        A NumPy scalar, or an array of the other kind, is a copy.
        """
        if not isinstance(array, type(self._np)):
            return None
        offset = self._storage.offset_of(array)
        item = self.dtype.itemsize
        if offset is None or offset % item or any(s % item for s in array.strides):
            return None
        return Tensor(self._storage, offset // item, array.shape, [s // item for s in array.strides], self.dtype)

    def view(self, *shape):
        shape = _shape_args(shape)
        if not self.is_contiguous():
            raise RuntimeError("view size is not compatible with input tensor's size and stride: "
                               "call .contiguous() or use .reshape()")
        return self.reshape(*shape)

    def reshape(self, *shape):
        from . import autograd
        return autograd.reshape(self, _shape_args(shape))

    def contiguous(self):
        return self if self.is_contiguous() else self.clone()

    def detach(self):
        """A tensor on the same storage that does not require grad (and is not part of a graph)."""
        return Tensor(self._storage, self._offset, self._shape, self._strides, self.dtype)

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, other):
        self._storage, self._offset = other._storage, other._offset
        self._shape, self._strides, self.dtype = other._shape, other._strides, other.dtype
        self._view_cache = None

    # -- copies and in-place writes (these never record gradients) --------------------------------

    def clone(self):
        """A copy with its own private storage (on the same device)."""
        from . import autograd
        return autograd.clone(self)

    def copy_(self, src):
        self._np[...] = src._np if isinstance(src, Tensor) else src
        return self

    def fill_(self, value):
        self._np.fill(value.item() if isinstance(value, Tensor) else value)
        return self

    def zero_(self):
        return self.fill_(0)

    def add_(self, other, *, alpha=1):
        self._np[...] += _raw(other) * alpha if alpha != 1 else _raw(other)
        return self

    def sub_(self, other, *, alpha=1):
        self._np[...] -= _raw(other) * alpha if alpha != 1 else _raw(other)
        return self

    def mul_(self, other):
        self._np[...] *= _raw(other)
        return self

    def div_(self, other):
        self._np[...] /= _raw(other)
        return self

    def clamp_(self, min=None, max=None):
        np.clip(self._np, min, max, out=self._np)
        return self

    def normal_(self, mean=0.0, std=1.0):
        self._np[...] = random.generator().normal(mean, std, self._shape)
        return self

    def uniform_(self, a=0.0, b=1.0):
        self._np[...] = random.generator().uniform(a, b, self._shape)
        return self

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    # -- values ---------------------------------------------------------------------------------

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has {self.numel()}: index it first")
        return self.__array__().reshape(-1)[0].item()

    def tolist(self):
        return self.__array__().tolist()

    def to(self, target=None, dtype=None, **kwargs):
        """``to("cuda")``, ``to("cpu")``, ``to(dtype)`` or ``to(device, dtype)``."""
        if isinstance(target, (np.dtype, type)) or (isinstance(target, str) and target not in _DEVICES and not target.startswith("cuda")):
            dtype, target = target, None
        t = self
        if dtype is not None and np.dtype(dtype) != t.dtype:
            t = Tensor._wrap(t.__array__().astype(dtype), t.device)
        if target is not None:
            target = str(target)
            if target.startswith("cuda") and not t.is_cuda:
                t = t.cuda()
            elif target == "cpu" and t.is_cuda:
                t = t.cpu()
        return t

    def cuda(self, device=None):
        """A copy of this tensor in GPU memory (a real GPU through CuPy, else the simulator)."""
        from . import cuda
        return self if self.is_cuda else cuda.to_device(self, "cuda" if device is None else f"cuda:{device}")

    def cpu(self):
        if not self.is_cuda:
            return self
        from . import cuda
        return cuda.to_host(self)

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    def long(self):
        return self.to(int64)

    def int(self):
        return self.to(int32)

    def bool(self):
        return self.to(bool_)

    def type(self, dtype=None):
        return str(self.dtype) if dtype is None else self.to(dtype)

    def __repr__(self):
        body = np.array2string(self.__array__(), separator=", ", prefix="tensor(")
        extras = []
        if self.dtype not in (float32, int64, bool_):
            extras.append(f"dtype=mpviz.{self.dtype}")
        if self.is_cuda:
            extras.append(f"device='{self.device}'")
        if self._grad_fn is not None:
            extras.append(f"grad_fn=<{getattr(self._grad_fn, 'name', 'Backward')}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return f"tensor({body}{''.join(', ' + e for e in extras)})"

    def __bool__(self):
        if self.numel() != 1:
            raise RuntimeError("the truth value of a tensor with more than one element is ambiguous: use .any() or .all()")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        return int(self.item())

    def __hash__(self):
        return id(self)

    # -- arithmetic: differentiable, so it lives in mpviz.autograd ---------------------------------

    def __add__(self, other):
        return _ag().add(self, other)

    def __radd__(self, other):
        return _ag().add(other, self)

    def __sub__(self, other):
        return _ag().sub(self, other)

    def __rsub__(self, other):
        return _ag().sub(other, self)

    def __mul__(self, other):
        return _ag().mul(self, other)

    def __rmul__(self, other):
        return _ag().mul(other, self)

    def __truediv__(self, other):
        return _ag().div(self, other)

    def __rtruediv__(self, other):
        return _ag().div(other, self)

    def __neg__(self):
        return _ag().neg(self)

    def __pow__(self, exponent):
        return _ag().pow(self, exponent)

    def __matmul__(self, other):
        return _ag().matmul(self, other)

    def __rmatmul__(self, other):
        return _ag().matmul(other, self)

    def add(self, other, *, alpha=1):
        return _ag().add(self, other * alpha if alpha != 1 else other)

    def sub(self, other):
        return _ag().sub(self, other)

    def mul(self, other):
        return _ag().mul(self, other)

    def div(self, other):
        return _ag().div(self, other)

    def matmul(self, other):
        return _ag().matmul(self, other)

    mm = matmul

    def exp(self):
        return _ag().exp(self)

    def log(self):
        return _ag().log(self)

    def sqrt(self):
        return _ag().pow(self, 0.5)

    def abs(self):
        return _ag().abs(self)

    __abs__ = abs

    def relu(self):
        return _ag().relu(self)

    def tanh(self):
        return _ag().tanh(self)

    def sigmoid(self):
        return _ag().sigmoid(self)

    def sum(self, dim=None, keepdim=False):
        return _ag().sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return _ag().mean(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return _ag().max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        return _ag().min(self, dim, keepdim)

    def t(self):
        return _ag().transpose(self, 0, 1) if self.dim() == 2 else self

    def transpose(self, dim0, dim1):
        return _ag().transpose(self, dim0, dim1)

    @property
    def T(self):
        return self.t()

    def flatten(self, start_dim=0):
        return self.reshape(*self._shape[:start_dim], -1)

    def unsqueeze(self, dim):
        shape = list(self._shape)
        shape.insert(dim if dim >= 0 else len(shape) + dim + 1, 1)
        return self.reshape(*shape)

    def squeeze(self, dim=None):
        if dim is not None:
            dim %= max(self.dim(), 1)
        shape = [n for i, n in enumerate(self._shape) if n != 1 or (dim is not None and i != dim)]
        return self.reshape(*shape)

    def backward(self, gradient=None):
        """Fill ``.grad`` of every leaf that requires grad, by reverse-mode differentiation."""
        _ag().backward(self, gradient)

    def requires_grad_(self, requires_grad=True):
        if requires_grad and self.dtype.kind not in "fc":
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients (this one is {self.dtype})")
        if not self.is_leaf and not requires_grad:
            raise RuntimeError("you can only change requires_grad of leaf tensors: use detach()")
        self.requires_grad = requires_grad
        return self

    @property
    def is_leaf(self):
        return self._grad_fn is None

    @property
    def grad_fn(self):
        return self._grad_fn

    # -- comparisons (never differentiable) -------------------------------------------------------

    def _compare(self, other, op):
        return Tensor._wrap(op(self.__array__(), _raw(other)), self.device)

    def __eq__(self, other):
        return self._compare(other, np.equal)

    def __ne__(self, other):
        return self._compare(other, np.not_equal)

    def __lt__(self, other):
        return self._compare(other, np.less)

    def __le__(self, other):
        return self._compare(other, np.less_equal)

    def __gt__(self, other):
        return self._compare(other, np.greater)

    def __ge__(self, other):
        return self._compare(other, np.greater_equal)

    def eq(self, other):
        return self == other

    def equal(self, other):
        return self.shape == other.shape and bool(np.array_equal(self.__array__(), _raw(other)))

    def allclose(self, other, rtol=1e-5, atol=1e-8):
        return bool(np.allclose(self.__array__(), _raw(other), rtol=rtol, atol=atol))

    def argmax(self, dim=None, keepdim=False):
        return Tensor._wrap(np.argmax(self.__array__(), axis=dim, keepdims=keepdim), self.device)

    def argmin(self, dim=None, keepdim=False):
        return Tensor._wrap(np.argmin(self.__array__(), axis=dim, keepdims=keepdim), self.device)

    def any(self):
        return Tensor._wrap(np.any(self.__array__()), self.device)

    def all(self):
        return Tensor._wrap(np.all(self.__array__()), self.device)


_DEVICES = ("cpu",)


def _ag():
    from . import autograd  # imported late: autograd builds Tensors itself
    return autograd


def _raw(x):
    """The NumPy value of a Tensor, or `x` itself for numbers and arrays."""
    return x.__array__() if isinstance(x, Tensor) else x


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _shape_args(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, Size)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


# Until mpviz.multiprocessing.reductions registers the real reducer (see there), the first tensor
# multiprocessing pickles loads it.
ForkingPickler.register(Tensor, reduce_on_first_send)
