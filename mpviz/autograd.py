"""Reverse-mode automatic differentiation on NumPy arrays, micrograd-sized.

Every differentiable operation does two things side by side: it computes its result *forward*,
and it writes down how to send a gradient *backward* to its inputs. The note is a :class:`Node`
stored on the result as ``result._grad_fn``::

    a (leaf, requires_grad)    b (leaf, requires_grad)
          \\                    /
           c = a * b           c._grad_fn = Node("MulBackward0", inputs=(a, b),
            |                                    backward=lambda g: (g * b, g * a))
           loss = c.sum()      loss._grad_fn = Node("SumBackward0", inputs=(c,), ...)

``loss.backward()`` sorts the graph so that every tensor comes after all the tensors made from it
(a topological sort), then walks it from ``loss`` down, handing each Node the gradient of its
result and adding what it returns to its inputs' gradients. When the walk reaches a *leaf* (a
tensor made by the user, not by an op) that requires grad, the gradient is added into ``.grad``.

``with no_grad():`` switches recording off (optimizers and evaluation loops use it). The switch is
per thread, as in torch, and each process has its own.

Adapted from Karpathy's micrograd (``engine.py``: scalars, a closure per op, topological sort),
lifted to arrays. Left out, compared with torch: in-place ops on tensors that require grad
(``add_`` and friends never record), ``retain_graph`` (the graph stays until it is garbage, so a
second ``backward()`` on it simply adds again), higher-order gradients, and hooks (but for :func:`queue_callback`). What an op
keeps of its inputs: :class:`Node`. Fork: :class:`AutogradForkError`.
"""
import builtins
import contextlib
import os
import sys
import threading
from collections import namedtuple

import numpy as np

from .tensor import Tensor


# -- the on/off switch ----------------------------------------------------------------------------

_state = threading.local()


def is_grad_enabled():
    """True unless this thread is inside ``no_grad()``."""
    return getattr(_state, "enabled", True)


class set_grad_enabled(contextlib.ContextDecorator):
    """Switch gradient recording on or off for this thread, for a ``with`` block or a function."""

    def __init__(self, mode):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled(mode) expects True or False, not {mode!r}")
        self.mode = mode

    def __enter__(self):
        self._previous = is_grad_enabled()
        _state.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _state.enabled = self._previous
        return False


class no_grad(set_grad_enabled):
    """``with no_grad():`` or ``@no_grad()``: results of ops are not recorded for backward."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """``with enable_grad():`` records again inside a ``no_grad()`` block."""

    def __init__(self):
        super().__init__(True)


# -- the graph ------------------------------------------------------------------------------------

class Node:
    """How to send a result's gradient back to the inputs it was made from.

    `backward` takes the gradient of the result (a NumPy array of the result's shape) and returns
    one gradient per input, each of that input's shape (or None for "nothing to send").

    Ops keep their inputs' values as *views*, not copies, as torch keeps the tensors: change an
    input in place between forward and ``backward()`` and the gradient uses the new values
    (torch would raise; in Hogwild, other processes do exactly this to the shared parameters, in
    both).
    """

    __slots__ = ("name", "inputs", "backward")

    def __init__(self, name, inputs, backward):
        self.name = name
        self.inputs = inputs
        self.backward = backward

    def __repr__(self):
        return f"<{self.name}>"


def _needs_grad(*operands):
    return is_grad_enabled() and builtins.any(isinstance(x, Tensor) and x.requires_grad for x in operands)


def _result(value, operands, name, backward):
    """The result tensor of an op: `value` on the operands' device, with a Node if it needs one."""
    device = next((x.device for x in operands if isinstance(x, Tensor)), "cpu")
    out = Tensor._wrap(np.asarray(value), device)
    return _attach(out, operands, name, backward)


def _attach(out, operands, name, backward):
    """Make `out` a graph node (if recording, and some operand requires grad)."""
    if _needs_grad(*operands):
        out.requires_grad = True
        out._grad_fn = Node(name, tuple(operands), backward)
    return out


def _value(x):
    """The NumPy value of an operand (a Tensor, a number or an array)."""
    if isinstance(x, Tensor):
        return x.__array__()
    return np.asarray(x) if isinstance(x, (list, tuple)) else x


def _unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the gradient of an operand that broadcasting repeated.

    Broadcasting: ``(3, 4) + (4,)`` uses the ``(4,)`` operand three times, so its gradient is the
    sum of the three — :func:`_unbroadcast` sums a gradient back down to its operand's shape."""
    grad = np.asarray(grad)
    while grad.ndim > len(shape):          # leading dimensions the operand did not have
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):       # dimensions where the operand had size 1
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


# -- elementwise binary ops -------------------------------------------------------------------------

def add(a, b):
    av, bv = _value(a), _value(b)

    def backward(g):
        return _unbroadcast(g, np.shape(av)), _unbroadcast(g, np.shape(bv))
    return _result(av + bv, (a, b), "AddBackward0", backward)


def sub(a, b):
    av, bv = _value(a), _value(b)

    def backward(g):
        return _unbroadcast(g, np.shape(av)), _unbroadcast(-g, np.shape(bv))
    return _result(av - bv, (a, b), "SubBackward0", backward)


def mul(a, b):
    av, bv = _value(a), _value(b)

    def backward(g):
        return _unbroadcast(g * bv, np.shape(av)), _unbroadcast(g * av, np.shape(bv))
    return _result(av * bv, (a, b), "MulBackward0", backward)


def div(a, b):
    av, bv = _value(a), _value(b)

    def backward(g):
        return _unbroadcast(g / bv, np.shape(av)), _unbroadcast(-g * av / (bv * bv), np.shape(bv))
    return _result(av / bv, (a, b), "DivBackward0", backward)


def pow(a, exponent):
    av, ev = _value(a), _value(exponent)
    out = np.power(av, ev)

    def backward(g):
        ga = g * ev * np.power(av, ev - 1)
        gb = None
        if isinstance(exponent, Tensor) and exponent.requires_grad:
            with np.errstate(divide="ignore", invalid="ignore"):  # d/de a**e = a**e * log(a)
                gb = _unbroadcast(g * out * np.log(av), np.shape(ev))
        return _unbroadcast(ga, np.shape(av)), gb
    return _result(out, (a, exponent), "PowBackward0", backward)


def matmul(a, b):
    av, bv = _value(a), _value(b)
    if np.ndim(av) == 0 or np.ndim(bv) == 0:
        raise ValueError(f"matmul needs tensors with at least 1 dimension, got shapes "
                         f"{np.shape(av)} and {np.shape(bv)}: use * to multiply by a scalar")

    def backward(g):
        # Treat vectors as matrices (a row on the left, a column on the right), as matmul does.
        A = av[None, :] if av.ndim == 1 else av
        B = bv[:, None] if bv.ndim == 1 else bv
        G = g
        if bv.ndim == 1:
            G = np.expand_dims(G, -1)
        if av.ndim == 1:
            G = np.expand_dims(G, -2)
        ga = G @ np.swapaxes(B, -1, -2)    # dL/dA = dL/dC @ B^T
        gb = np.swapaxes(A, -1, -2) @ G    # dL/dB = A^T @ dL/dC
        if av.ndim == 1:
            ga = ga[..., 0, :]
        if bv.ndim == 1:
            gb = gb[..., :, 0]
        return _unbroadcast(ga, av.shape), _unbroadcast(gb, bv.shape)
    return _result(av @ bv, (a, b), "MmBackward0", backward)


# -- elementwise unary ops --------------------------------------------------------------------------

def neg(a):
    return _result(-_value(a), (a,), "NegBackward0", lambda g: (-g,))


def exp(a):
    out = np.exp(_value(a))
    return _result(out, (a,), "ExpBackward0", lambda g: (g * out,))


def log(a):
    av = _value(a)
    return _result(np.log(av), (a,), "LogBackward0", lambda g: (g / av,))


def abs(a):
    av = _value(a)
    return _result(np.abs(av), (a,), "AbsBackward0", lambda g: (g * np.sign(av),))


def relu(a):
    av = _value(a)
    return _result(np.maximum(av, 0), (a,), "ReluBackward0", lambda g: (g * (av > 0),))


def tanh(a):
    out = np.tanh(_value(a))
    return _result(out, (a,), "TanhBackward0", lambda g: (g * (1 - out * out),))


def sigmoid(a):
    out = np.exp(-np.logaddexp(0, -_value(a)))  # 1 / (1 + e^-x), without overflow for x << 0
    return _result(out, (a,), "SigmoidBackward0", lambda g: (g * out * (1 - out),))


# -- reductions -------------------------------------------------------------------------------------

def _axes(dim, ndim):
    """`dim` (None, an int or a tuple of ints; negatives count from the end) as a sorted tuple."""
    if dim is None:
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    axes = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise TypeError(f"dim must be an int or a tuple of ints, not {d!r}")
        if not -builtins.max(ndim, 1) <= d < builtins.max(ndim, 1):
            raise ValueError(f"dim {d} is out of range for a tensor with {ndim} dimension(s) "
                             f"(expected a value in [{-builtins.max(ndim, 1)}, {builtins.max(ndim, 1) - 1}])")
        axes.append(int(d) % builtins.max(ndim, 1))
    return tuple(sorted(axes)) if ndim else ()


def _expand_back(g, shape, axes, keepdim):
    """Spread a reduced gradient `g` back over the reduced `axes` of `shape`."""
    if not keepdim:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


def sum(a, dim=None, keepdim=False):
    av = _value(a)
    axes = _axes(dim, np.ndim(av))
    out = np.sum(av, axis=axes, keepdims=keepdim)
    return _result(out, (a,), "SumBackward0",
                   lambda g: (_expand_back(g, av.shape, axes, keepdim),))


def mean(a, dim=None, keepdim=False):
    av = _value(a)
    axes = _axes(dim, np.ndim(av))
    out = np.mean(av, axis=axes, keepdims=keepdim)
    count = builtins.max(int(np.prod([av.shape[i] for i in axes])), 1)
    return _result(out, (a,), "MeanBackward0",
                   lambda g: (_expand_back(g, av.shape, axes, keepdim) / count,))


max_result = namedtuple("max", ["values", "indices"])  # what torch returns from t.max(dim)
min_result = namedtuple("min", ["values", "indices"])  # ... and from t.min(dim)


def max(a, dim=None, keepdim=False):
    """``t.max()``: the largest element. ``t.max(dim)``: ``(values, indices)`` along `dim`, as torch.

    Gradient: with `dim`, to the element each index picked; without, shared evenly by all the
    elements equal to the maximum (torch does the same).
    """
    return _extreme(a, dim, keepdim, np.max, np.argmax, max_result, "Max")


def min(a, dim=None, keepdim=False):
    """``t.min()`` and ``t.min(dim)``: as :func:`max`, for the smallest."""
    return _extreme(a, dim, keepdim, np.min, np.argmin, min_result, "Min")


def _extreme(a, dim, keepdim, pick, arg_pick, result_type, name):
    av = _value(a)
    if dim is None:
        out = pick(av)

        def backward_all(g):
            winners = av == out
            return (g * winners / np.count_nonzero(winners),)
        return _result(out, (a,), f"{name}Backward1", backward_all)

    axis = _axes(dim, av.ndim)[0] if av.ndim else None
    if axis is None:  # a 0-d tensor: its own extreme, at index 0
        return result_type(_result(av, (a,), f"{name}Backward0", lambda g: (g,)),
                           Tensor._wrap(np.int64(0), a.device))
    idx = np.expand_dims(arg_pick(av, axis=axis), axis)
    values = np.take_along_axis(av, idx, axis)

    def backward(g):
        grad = np.zeros(av.shape, dtype=np.result_type(g, av))
        np.put_along_axis(grad, idx, g if keepdim else np.expand_dims(g, axis), axis)
        return (grad,)
    indices = idx if keepdim else np.squeeze(idx, axis)
    if not keepdim:
        values = np.squeeze(values, axis)
    return result_type(_result(values, (a,), f"{name}Backward0", backward),
                       Tensor._wrap(indices, a.device))


# -- views and copies -------------------------------------------------------------------------------

def transpose(a, d0, d1):
    d0, d1 = _axes(d0, a.dim())[0], _axes(d1, a.dim())[0]
    out = a._as_view(np.swapaxes(a._np, d0, d1))  # a view: same storage, swapped strides
    return _attach(out, (a,), "TransposeBackward0", lambda g: (np.swapaxes(g, d0, d1),))


def reshape(a, shape):
    try:
        r = a._np.reshape(shape)
    except ValueError as e:
        raise ValueError(f"shape {list(shape)} is invalid for a tensor of shape {list(a.shape)} "
                         f"({a.numel()} elements): the sizes must multiply to {a.numel()} ({e})") from None
    out = a._as_view(r)                           # a view when NumPy could reshape without copying
    if out is None:
        out = Tensor._wrap(r, a.device)
    return _attach(out, (a,), "ViewBackward0", lambda g: (np.reshape(g, a._shape),))


def clone(a):
    return _result(np.array(_value(a), copy=True), (a,), "CloneBackward0", lambda g: (g,))


def track_getitem(out, src, index):
    """Called by ``Tensor.__getitem__``: make ``out = src[index]`` a graph node.

    Backward scatters the gradient into a zero array of src's shape with ``np.add.at``, which adds
    (rather than overwrites) where an index repeats: ``x[[0, 0]]`` uses ``x[0]`` twice.
    """
    def backward(g):
        grad = np.zeros(src._shape, dtype=np.result_type(g, src.dtype))
        np.add.at(grad, index, g)
        return (grad,)
    _attach(out, (src,), "IndexBackward0", backward)


# -- fork safety -----------------------------------------------------------------------------------
# torch (engine.cpp, ``start_device_threads``): on its first backward, on a machine with a GPU,
# the engine starts one worker thread per device. A forked child would get the engine's state
# but not those threads, so the engine registers an at-fork handler (pthread_atfork) that marks
# every child forked from then on, and ``backward()`` in a marked child refuses. With no GPU it
# starts no threads and registers nothing: on a CPU-only machine, backward in a forked child of a
# process that ran backward works (torch 2.13 CPU, observed).
# mpviz has no engine threads but keeps the rule, so the lesson can be run. Simplified trigger:
# mpviz's device is ``mpviz.cuda`` (the simulator or a GPU), and it counts once *this process* has
# used it (torch counts a GPU that is merely present): CPU-only programs behave as on CPU-only
# torch.

FORK_TEXT = ("Unable to handle autograd's threading in combination with fork-based "
             "multiprocessing. See https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork")


class AutogradForkError(RuntimeError):
    """Raised when ``backward()`` runs in a child forked (``fork``) from a process whose autograd
    engine had started its device threads (it ran backward with a CUDA device in use).

    Fork: torch's engine refuses ``backward()`` in a child forked from a process whose engine had
    started its per-device threads ("Unable to handle autograd's threading in combination with
    fork-based multiprocessing"); mpviz keeps that rule, with a simpler trigger (see "fork safety"
    above)."""

    def __init__(self):
        super().__init__(
            f"{FORK_TEXT} (mpviz: this process is a fork of one that ran backward() while it "
            f"used CUDA; torch's engine had started a thread per device there, and a fork copies "
            f"the engine without its threads. Fix: start the workers with 'spawn' or "
            f"'forkserver' (mp.get_context('spawn')), or fork them before the parent's first "
            f"backward().)")

    def __reduce__(self):
        return (type(self), ())


_device_threads_started = False    # this process's engine "started its device threads"
_in_bad_fork = False                # this process was forked after that (set by the at-fork mark)
_mark_registered = False


def _mark_forked_child():
    global _in_bad_fork
    if _device_threads_started:     # (always, once set -- unless a test resets it: conftest.py)
        _in_bad_fork = True


def _start_device_threads():
    """On the first backward with a CUDA device in use: register the at-fork mark, once."""
    global _device_threads_started, _mark_registered
    if _device_threads_started:
        return
    cuda = sys.modules.get("mpviz.cuda")          # not imported: CUDA was never used here
    if cuda is None or not cuda.is_initialized():
        return
    _device_threads_started = True
    if hasattr(os, "register_at_fork") and not _mark_registered:
        os.register_at_fork(after_in_child=_mark_forked_child)
        _mark_registered = True


# -- backward ---------------------------------------------------------------------------------------

def _topological_order(root):
    """Every tensor `root` was made from, each after all the tensors made from it (root first)."""
    order, seen = [], set()
    stack = [(root, False)]
    while stack:                            # depth-first, without recursion (graphs can be deep)
        t, children_done = stack.pop()
        if children_done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t._grad_fn is not None:
            for x in t._grad_fn.inputs:
                if isinstance(x, Tensor) and x.requires_grad and id(x) not in seen:
                    stack.append((x, False))
    return order[::-1]                      # inputs were appended before their results


def _accumulate_into_leaf(leaf, g):
    g = np.asarray(g, dtype=leaf.dtype)
    if g.shape != leaf._shape:
        g = np.broadcast_to(g, leaf._shape)
    if leaf.grad is None:
        leaf.grad = Tensor._wrap(g, leaf.device)
    elif leaf.grad.is_cuda:
        leaf.grad = Tensor._wrap(leaf.grad.__array__() + g, leaf.device)
    else:
        leaf.grad._np[...] += g             # in place: a grad in shared memory stays shared


def backward(t, gradient=None):
    """Fill ``.grad`` of every leaf that `t` was computed from and that requires grad."""
    if not isinstance(t, Tensor):
        raise TypeError(f"backward() needs a Tensor, not {type(t).__name__}")
    if _in_bad_fork:
        raise AutogradForkError()
    _start_device_threads()
    if not t.requires_grad:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn "
                           "(nothing it was computed from has requires_grad=True, or it was "
                           "computed inside no_grad())")
    if gradient is None:
        if t.numel() != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs (this one "
                               f"has shape {list(t.shape)}): reduce it first, e.g. "
                               f"out.sum().backward(), or pass backward(gradient=...)")
        gradient = np.ones(t._shape, dtype=t.dtype)
    else:
        gradient = np.asarray(_value(gradient), dtype=t.dtype)
        if gradient.shape != t._shape:
            raise ValueError(f"Mismatch in shape: gradient has a shape of {list(gradient.shape)} "
                             f"and output has a shape of {list(t.shape)}: pass a gradient of the "
                             f"output's shape")

    grads = {id(t): gradient}
    _queued.clear()
    for node in _topological_order(t):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if node._grad_fn is None:           # a leaf that requires grad
            _accumulate_into_leaf(node, g)
            continue
        for x, gx in zip(node._grad_fn.inputs, node._grad_fn.backward(g)):
            if gx is None or not (isinstance(x, Tensor) and x.requires_grad):
                continue
            grads[id(x)] = grads[id(x)] + gx if id(x) in grads else gx
    while _queued:                          # every .grad is filled: what a Node asked to run now
        _queued.pop(0)()


_queued = []


def queue_callback(callback):
    """Run `callback()` when the backward() in progress has filled every ``.grad``: torch's
    ``Variable._execution_engine.queue_callback``, with which DDP averages the gradients."""
    _queued.append(callback)


def zero_grads(parameters, set_to_none=True):
    """Forget the gradients of `parameters`: set them to None (torch's default) or fill them
    with zeros (in place: a gradient in shared memory stays shared)."""
    for p in parameters:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            p.grad.zero_()
