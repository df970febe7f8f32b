"""The layers a small classifier needs: Linear, ReLU and Sequential.

``Linear(in, out)`` holds ``weight`` (out × in) and ``bias`` (out) and computes
``x @ weight.T + bias``. Its initial values follow torch's ``reset_parameters``: both drawn
uniformly from ``[-1/sqrt(in), 1/sqrt(in)]`` (what ``kaiming_uniform_(a=sqrt(5))`` works out to),
so outputs start at a sensible scale whatever the width. The draws come from mpviz's random
generator: ``mpviz.manual_seed(0)`` before building a model makes it the same every time.

Adapted from torch's ``torch/nn/modules/linear.py``, ``activation.py`` and ``container.py``.
"""
import math
from collections import OrderedDict

from .. import empty
from . import functional as F
from .module import Module, Parameter


class Linear(Module):
    """``y = x @ weight.T + bias``, with ``weight`` of shape (out_features, in_features)."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(n, int) or isinstance(n, bool):
                raise TypeError(f"Linear({name}=...) must be an int, not {type(n).__name__}")
            if n <= 0:
                raise ValueError(f"Linear({name}=...) must be positive, got {n}")
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        self.weight = Parameter(empty(out_features, in_features).uniform_(-bound, bound))
        if bias:
            self.bias = Parameter(empty(out_features).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        y = x @ self.weight.t()
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    """``max(x, 0)``, elementwise."""

    def forward(self, x):
        return F.relu(x)


class MSELoss(Module):
    """The mean (``reduction="mean"``), sum (``"sum"``) or elementwise (``"none"``) squared
    difference of ``input`` and ``target``: ``torch.nn.MSELoss``, a Module around
    ``functional.mse_loss`` (torch's deprecated ``size_average``/``reduce`` are left out; its
    repr is torch's, ``MSELoss()``, whatever the reduction)."""

    def __init__(self, reduction="mean"):
        super().__init__()
        F.check_reduction(reduction, "MSELoss")          # (torch checks only when called)
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class Sequential(Module):
    """Modules applied one after the other: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 3))``.

    Children are named "0", "1", … (or by the keys of an OrderedDict passed alone).
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            items = modules[0].items()
        else:
            items = ((str(i), m) for i, m in enumerate(modules))
        for name, m in items:
            if not isinstance(m, Module):
                raise TypeError(f"Sequential takes Modules, but item {name} is a "
                                f"{type(m).__name__}: wrap functions in a Module (e.g. nn.ReLU())")
            self.add_module(name, m)

    def forward(self, x):
        for m in self.children():
            x = m(x)
        return x

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]
