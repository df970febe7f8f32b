"""mpviz: see what multiprocessing does to your tensors.

The tensor side, with torch's names: ``import mpviz as torch`` runs torch.multiprocessing's
examples on NumPy. The process side is :mod:`mpviz.multiprocessing`; recording is
:mod:`mpviz.trace`; pictures are :mod:`mpviz.viz` (imported only when you draw).

Importing mpviz does nothing else: no threads, no files, no matplotlib -- and not even NumPy.
Every name below loads its module on first use (Python calls the module's ``__getattr__`` for a
name it does not have), so ``python -m mpviz trace -- true`` and the spawned children of a
program that imports only ``mpviz.multiprocessing`` start in a fraction of the time. After the
first use the names are plain attributes: ``torch.zeros`` costs nothing more than before.
"""
import os
import sys
import types

__version__ = "0.1.0"

# torch's top-level names: mpviz/functions.py (tensors need NumPy). `tensor` is also the name of
# the module that defines Tensor (mpviz/tensor.py): here it is torch's function, as in torch.
_FUNCTIONS = (
    "manual_seed", "Storage", "Size", "Tensor", "bool_", "check_dtype", "float16", "float32",
    "float64", "int8", "int16", "int32", "int64", "uint8", "no_grad", "enable_grad",
    "is_grad_enabled", "half", "float", "double", "long", "int", "bool", "UntypedStorage",
    "tensor", "from_numpy", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange",
    "zeros_like", "ones_like", "is_tensor", "stack", "cat",
)
# Submodules: loaded on first use too. (`mpviz.nn` then stays a plain attribute.)
_SUBMODULES = ("multiprocessing", "nn", "optim", "autograd", "cuda", "trace", "viz", "widgets",
               "scenarios", "examples", "sharing", "random", "storage", "errors")

__all__ = list(_FUNCTIONS)      # what `from mpviz import *` gives: torch's top-level names


def step(function, *args, **kwargs):
    """Run ``function(*args, **kwargs)`` stepped: you are the scheduler (see mpviz.stepper)."""
    from .stepper.control import step as stepped
    return stepped(function, *args, **kwargs)


def __getattr__(name):
    # Python calls this only for a name the module does not have yet; binding what it loads makes
    # every later use a plain attribute hit (no import per call).
    import importlib
    if name in _FUNCTIONS:
        functions = importlib.import_module(".functions", __name__)
        for each in _FUNCTIONS:
            globals()[each] = getattr(functions, each)
        return globals()[name]
    if name in _SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'mpviz' has no attribute {name!r}")


def __dir__():
    # Tab completion in Jupyter lists the names that are not loaded yet too.
    return sorted(set(globals()) | set(_FUNCTIONS) | set(_SUBMODULES))


class _Package(types.ModuleType):
    """mpviz's module type: keeps ``mpviz.tensor`` torch's function.

    When a submodule is first imported, Python binds it on its package: importing mpviz/tensor.py
    (``from mpviz.tensor import Tensor``, as mpviz.nn does) would set ``mpviz.tensor`` to that
    module, and ``mpviz.tensor([1, 2])`` would then fail with "'module' object is not callable".
    The module stays in sys.modules, where imports find it; the package's name stays the function.
    """

    def __setattr__(self, name, value):
        if name == "tensor" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

# A bad MPVIZ_* setting should fail here, at `import mpviz`, not at the first tensor sent. The
# sharing package checks them when it loads (it imports a handful of modules, none needed by a
# program that shares nothing), so load it now only if one is set.
if any(os.environ.get(name) for name in ("MPVIZ_SHARING_STRATEGY", "MPVIZ_SHM_CACHE_BYTES",
                                         "MPVIZ_SHM_TAG")):
    from . import sharing  # noqa: E402,F401
