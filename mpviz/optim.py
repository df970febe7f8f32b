"""Stochastic gradient descent that updates parameters in place.

``step()`` does, for each parameter ``p`` that has a gradient::

    p -= lr * p.grad                       (momentum = 0)

    buf = momentum * buf + p.grad          (momentum > 0; buf starts as the first grad)
    p -= lr * buf

*In place* is the point for multiprocessing: ``p._np[...] -= ...`` writes into the bytes that
``p`` already views. When the model called ``share_memory()``, those bytes are shared memory, so
every process training the same model sees the update at once (Hogwild: no locks; updates may
interleave, and that is fine for SGD). The momentum buffers are this process's own, unless
``share_memory()`` made them shared before the workers started (as torch users do with a
"shared optimizer", e.g. the A3C examples' SharedAdam): then every process that was given this
optimizer updates the same buffers.

Adapted from torch's ``torch/optim/sgd.py`` (defaults and update rule, dampening = 0, no
nesterov). Left out: weight decay, ``state_dict()``, learning-rate schedulers. A buffer that
``share_memory()`` made starts at zeros, which gives the same first step as torch's copy of the
first gradient (momentum x 0 + grad).
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
        # id(param) -> momentum buffer: a NumPy array private to this process, or a Tensor in
        # shared memory after share_memory()
        self.state = {}

    def share_memory(self):
        """Make every momentum buffer now, as zeros in shared memory, in place; returns self.

        Give this optimizer to the workers (with the model, in the same args, so that its
        parameters arrive as the model's) and they all update one buffer per parameter, instead
        of one each. Without momentum there is no state: nothing to share."""
        from . import zeros
        for group in self.param_groups:
            if not group["momentum"]:
                continue
            for p in group["params"]:
                buf = self.state.get(id(p))
                if isinstance(buf, Tensor):
                    buf.share_memory_()
                    continue
                shared = zeros(*p.shape, dtype=p.dtype).share_memory_()
                if buf is not None:
                    shared._np[...] = buf
                self.state[id(p)] = shared
        return self

    def __getstate__(self):
        # ids mean nothing in another process: key the state by (group, position) on the way
        state = {(gi, pi): self.state[id(p)] for gi, group in enumerate(self.param_groups)
                 for pi, p in enumerate(group["params"]) if id(p) in self.state}
        return {"param_groups": self.param_groups, "state": state}

    def __setstate__(self, saved):
        self.param_groups = saved["param_groups"]
        self.state = {id(self.param_groups[gi]["params"][pi]): buf
                      for (gi, pi), buf in saved["state"].items()}

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
                        if isinstance(buf, Tensor):
                            buf = buf._np          # a shared buffer: update its bytes in place
                        buf *= momentum
                        buf += g
                    g = buf
                p._np[...] -= lr * g

    def __repr__(self):
        group = self.param_groups[0]
        return f"SGD(lr={group['lr']}, momentum={group['momentum']}, params={len(group['params'])})"
