"""Losses and activations, written with the differentiable ops of :mod:`mpviz.autograd`.

Nothing here has its own backward: each function is a few tensor operations, and autograd
differentiates them. Two tricks worth seeing:

* ``log_softmax(x) = x - log(sum(exp(x)))`` would overflow for large ``x``, so it first subtracts
  each row's maximum ``m`` (a constant, detached): ``(x - m) - log(sum(exp(x - m)))``. The
  result is the same, and ``exp`` never sees a number above 0.
* ``nll_loss(logp, target)`` picks ``logp[i, target[i]]`` for each row ``i`` with one
  advanced-indexing step; its gradient scatters back into those positions
  (:func:`mpviz.autograd.track_getitem`).

Adapted from torch's ``torch/nn/functional.py`` (same names and defaults: ``reduction="mean"``).
Left out: class weights, ``ignore_index``, label smoothing.
"""
import numpy as np

from ..tensor import Tensor


def relu(x):
    return _tensor(x, "relu", "x").relu()


def log_softmax(x, dim):
    """log(softmax(x)) along `dim`, computed without overflow."""
    x = _tensor(x, "log_softmax", "x")
    m = x.max(dim, keepdim=True).values.detach()
    shifted = x - m
    return shifted - shifted.exp().sum(dim, keepdim=True).log()


def nll_loss(input, target, reduction="mean"):
    """Negative log-likelihood: ``-input[i, target[i]]``, averaged (or summed) over rows i.

    `input` holds log-probabilities of shape (N, C); `target` the class of each row, ints in [0, C).
    """
    input = _tensor(input, "nll_loss", "input")
    target = _tensor(target, "nll_loss", "target")
    if input.dim() != 2:
        raise ValueError(f"nll_loss expects input of shape (N, C) (log-probabilities, one row per "
                         f"sample), got shape {list(input.shape)}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"nll_loss expects target to hold class indices (an integer tensor), got "
                        f"dtype {target.dtype}: convert with target.long()")
    n, c = input.shape
    if tuple(target.shape) != (n,):
        raise ValueError(f"nll_loss expects target of shape ({n},), one class per row of input, "
                         f"got {list(target.shape)}")
    classes = target.__array__()
    if n and (classes.min() < 0 or classes.max() >= c):
        raise ValueError(f"nll_loss: target holds a class outside [0, {c}) (min {classes.min()}, "
                         f"max {classes.max()}): input has {c} columns, one per class")
    picked = -input[np.arange(n), classes]
    return _reduce(picked, reduction, "nll_loss")


def cross_entropy(input, target, reduction="mean"):
    """``nll_loss(log_softmax(input, 1), target)``: the classifier's loss, from raw scores."""
    return nll_loss(log_softmax(input, 1), target, reduction)


def mse_loss(input, target, reduction="mean"):
    """Mean (or summed) squared difference."""
    input = _tensor(input, "mse_loss", "input")
    if isinstance(target, Tensor) and tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"mse_loss expects input and target of the same shape, got "
                         f"{list(input.shape)} and {list(target.shape)}")
    diff = input - target
    return _reduce(diff * diff, reduction, "mse_loss")


def _reduce(losses, reduction, fn):
    check_reduction(reduction, fn)
    if reduction == "mean":
        return losses.mean()
    if reduction == "sum":
        return losses.sum()
    return losses


def check_reduction(reduction, fn):
    """torch's words for a reduction that is none of "mean", "sum", "none", then the fix."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction. Why: {fn} averages "
                         f"(\"mean\"), adds up (\"sum\") or keeps (\"none\") the losses of "
                         f"the elements. Fix: reduction=\"mean\", \"sum\" or \"none\".")


def _tensor(x, fn, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}() expects {name} to be a Tensor, not {type(x).__name__}: "
                        f"wrap it with mpviz.tensor(...)")
    return x
