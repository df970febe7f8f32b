"""Stochastic gradient descent that updates parameters in place.

``step()`` does, for each parameter ``p`` that has a gradient::

    p -= lr * p.grad                       (momentum = 0)

    buf = momentum * buf + p.grad          (momentum > 0; buf starts as the first grad)
    p -= lr * buf

*In place* is the point for multiprocessing: ``p._np[...] -= ...`` writes into the bytes that
``p`` already views. When the model called ``share_memory()``, those bytes are shared memory, so
every process training the same model sees the update at once (Hogwild: no locks; updates may
interleave, and that is fine for SGD). The momentum buffers are this process's own.

Adapted from torch's ``torch/optim/sgd.py`` (defaults and update rule, dampening = 0, no
nesterov). Left out: weight decay, ``state_dict()``, learning-rate schedulers.
"""
import numpy as np

from . import autograd
from .tensor import Tensor


class SGD:
    """``SGD(model.parameters(), lr=0.1, momentum=0.0)``."""

    def __init__(self, params, lr, momentum=0.0):
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors, but got a single Tensor: pass model.parameters() or [t]")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list: did the model assign its "
                             "layers as attributes (self.fc = nn.Linear(...)) after super().__init__()?")
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but params[{i}] is a "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"can't optimize a non-leaf Tensor (params[{i}] was computed by "
                                 f"{p.grad_fn}): optimize the tensors you created, or detach() it")
        for name, value in (("lr", lr), ("momentum", momentum)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"SGD({name}=...) must be a number, not {type(value).__name__}")
            if value < 0:
                raise ValueError(f"Invalid {name} value: {value} (must be >= 0)")
        self.param_groups = [{"params": params, "lr": lr, "momentum": momentum}]
        self.state = {}  # id(param) -> momentum buffer (a NumPy array private to this process)

    def zero_grad(self, set_to_none=True):
        """Forget the gradients: set them to None (torch's default) or fill them with zeros."""
        autograd.zero_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    def step(self):
        """Move each parameter against its gradient, in place (shared parameters: for everyone)."""
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.__array__()
                if momentum:
                    buf = self.state.get(id(p))
                    if buf is None:
                        buf = self.state[id(p)] = np.array(g, copy=True)
                    else:
                        buf *= momentum
                        buf += g
                    g = buf
                p._np[...] -= lr * g

    def __repr__(self):
        group = self.param_groups[0]
        return f"SGD(lr={group['lr']}, momentum={group['momentum']}, params={len(group['params'])})"
