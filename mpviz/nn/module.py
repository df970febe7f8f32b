"""Parameter and Module: how a model knows its own tensors.

A ``Module`` keeps two small dictionaries, filled by ordinary attribute assignment::

    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 32)     ->  self._modules["fc1"]
            self.scale = nn.Parameter(...)  ->  self._parameters["scale"]

``parameters()`` walks those dictionaries, recursively, and yields every ``Parameter`` once;
``named_parameters()`` adds dotted names (``"fc1.weight"``), which are also the keys of
``state_dict()``. Everything else a model does with "all its tensors" is a loop over that walk:

* ``zero_grad()`` sets each ``.grad`` to None;
* ``share_memory()`` calls ``share_memory_()`` on each parameter (and each existing grad), which
  moves its storage into shared memory *in place*. The model object stays the same; its bytes
  now live where every process can map them. That is why, under ``fork``, Hogwild needs this
  line: a forked child sees the parent's memory copy-on-write, so without it each child trains
  its own private copy and the parent's model never changes;
* ``load_state_dict()`` copies values *into* the existing tensors, so a shared model stays shared.

Adapted from torch's ``torch/nn/modules/module.py`` and ``torch/nn/parameter.py``. Left out:
buffers, hooks, ``apply``/``to``/``cuda``, and ``register_*`` beyond plain assignment.
"""
from collections import OrderedDict

import numpy as np

from .. import autograd
from ..storage import Storage
from ..tensor import Tensor


class Parameter(Tensor):
    """A tensor that is a model's parameter: ``requires_grad=True`` unless told otherwise.

    ``Parameter(t)`` shares `t`'s storage (no copy), as torch's does.

    A ``Parameter`` is a Tensor subclass whose only difference is ``requires_grad=True`` by default
    and being recognised by ``Module.__setattr__``. It holds no extra state on purpose: when a
    Parameter crosses a process, mpviz's unpickler rebuilds it with ``Tensor.__new__(cls)`` and
    ``Tensor.__init__(...)`` (:mod:`mpviz.multiprocessing.reductions`), so it comes back as a
    Parameter on the same shared storage.
    """

    def __init__(self, data=None, requires_grad=True, *rest):
        if isinstance(data, Storage):
            # Tensor's own signature (storage, offset, shape, strides, dtype[, requires_grad]):
            # Tensor._wrap and friends build subclasses this way.
            Tensor.__init__(self, data, requires_grad, *rest)
            return
        if data is None:
            data = Tensor._wrap(np.zeros(0, dtype=np.float32))
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(data) expects a Tensor, not {type(data).__name__}: "
                            f"wrap it first, e.g. nn.Parameter(mpviz.tensor(data))")
        Tensor.__init__(self, data._storage, data._offset, data._shape, data._strides,
                        data.dtype, requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)


class Module:
    """Base class for models: assign Parameters and Modules as attributes, define ``forward``."""

    def __init__(self):
        # object.__setattr__: our own __setattr__ needs these dictionaries to exist first.
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # -- attribute registration -----------------------------------------------------------------

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() has run: call "
                f"super().__init__() first thing in {type(self).__name__}.__init__")
        modules = self.__dict__["_modules"]
        if isinstance(value, Parameter):
            self.__dict__.pop(name, None)
            modules.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            self.__dict__.pop(name, None)
            params.pop(name, None)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as parameter {name!r} "
                                f"(nn.Parameter or None expected): wrap it, e.g. "
                                f"nn.Parameter(tensor)")
            params[name] = None
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module {name!r} "
                                f"(nn.Module or None expected)")
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only called when normal lookup fails: look in our dictionaries. Careful not to recurse
        # when they don't exist yet (e.g. while unpickling, before __dict__ is restored).
        d = self.__dict__
        for store in ("_parameters", "_modules"):
            if name in d.get(store, ()):
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in (self._parameters, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot register {type(param).__name__} as parameter {name!r} "
                            f"(nn.Parameter or None expected)")
        self._parameters[name] = param

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module

    # -- running --------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(): define "
                                  f"`def forward(self, x): ...` in the class")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def train(self, mode=True):
        """Set training mode here and in every submodule (``eval()`` is ``train(False)``)."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) expects True or False, not {mode!r}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    # -- walking the tree -----------------------------------------------------------------------

    def named_children(self):
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix=""):
        """This module and every module under it, each once, with dotted names ("" for self)."""
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, m = stack.pop(0)
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            stack[0:0] = [(f"{name}.{n}" if name else n, c) for n, c in m.named_children()]

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix="", recurse=True):
        """(dotted name, Parameter) for each parameter, each once (a shared one under its first name)."""
        seen = set()
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_name, m in modules:
            for name, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    # -- what every model does with all its tensors -----------------------------------------------

    def zero_grad(self, set_to_none=True):
        """Forget the gradients: set them to None (torch's default) or fill them with zeros."""
        autograd.zero_grads(self.parameters(), set_to_none)

    def share_memory(self):
        """Move every parameter (and every gradient that exists) into shared memory, in place."""
        for p in self.parameters():
            p.share_memory_()
            if p.grad is not None:
                p.grad.share_memory_()
        return self

    def state_dict(self):
        """{dotted name: tensor} for every parameter: detached tensors on the same storages."""
        return OrderedDict((name, p.detach()) for name, p in self.named_parameters())

    def load_state_dict(self, state_dict, strict=True):
        """Copy values into this model's parameters, in place (shared parameters stay shared).

        With ``strict=True`` the keys must match ``state_dict()``'s exactly. Returns
        ``(missing_keys, unexpected_keys)`` as torch does.
        """
        if not hasattr(state_dict, "items"):
            raise TypeError(f"load_state_dict expects a dict of tensors (as state_dict() returns), "
                            f"not {type(state_dict).__name__}")
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing))
        if strict and unexpected:
            problems.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected))
        for name, value in state_dict.items():
            if name not in own:
                continue
            array = np.asarray(value.__array__() if isinstance(value, Tensor) else value)
            if array.shape != own[name]._shape:
                problems.append(f"size mismatch for {name}: copying a param with shape "
                                f"{list(array.shape)} from checkpoint, the shape in current model "
                                f"is {list(own[name]._shape)}")
        if problems:
            raise ValueError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                             + "\n\t".join(problems))
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
        return missing, unexpected

    # -- printing -------------------------------------------------------------------------------

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        if not lines:
            return f"{type(self).__name__}({self.extra_repr()})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"
