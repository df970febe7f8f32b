"""Which CUDA backend does the work: chosen once per process, and looked up by name.

Two backends implement the same few functions (allocate, open a handle, copy to the host ...)::

    cupy_backend.py   a real GPU, through CuPy
    simulator.py      the same on shared memory, with poison where a GPU would fault

``choose()`` picks one the first time a process needs CUDA: ``$MPVIZ_CUDA_BACKEND`` if set
("cupy" or "simulator"), else CuPy when it can use a GPU, else the simulator (``reason`` says
why). Every handle names its backend, so a receiver looks the same one up (``by_name``), and a
storage's bytes are read through the backend that made them (``of``).

This module knows nothing of handles, counts or storages' lifetimes (``ipc.py``) nor of the
public API (``mpviz.cuda``): both import it, it imports neither.
"""
import os

from . import simulator

ENV = "MPVIZ_CUDA_BACKEND"          # "cupy", "simulator", or unset: choose

chosen = None    # the backend module of this process, once chosen
reason = None    # why the simulator was chosen


def by_name(name):
    """The backend module called `name` (a handle's first field)."""
    if name == simulator.NAME:
        return simulator
    if name == "cupy":
        from . import cupy_backend        # imports CuPy: only when a handle names it
        return cupy_backend
    raise ValueError(f"unknown CUDA backend {name!r}: expected 'cupy' or 'simulator'")


def of(storage):
    """The backend that holds a CudaStorage's bytes."""
    return by_name(storage._mem.backend)


def choose():
    """This process's backend, chosen on the first call (see the module's docstring)."""
    global chosen, reason
    if chosen is not None:
        return chosen
    from . import cupy_backend
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "cupy", "simulator"):
        raise ValueError(f"{ENV}={wanted!r} is not a CUDA backend: set it to 'cupy', "
                         f"'simulator', or leave it unset to use a GPU when there is one")
    if wanted == "simulator":
        chosen, reason = simulator, f"{ENV}=simulator"
        return chosen
    problem = cupy_backend.probe()
    if problem is None:
        chosen = cupy_backend
    elif wanted == "cupy":
        raise RuntimeError(f"{ENV}=cupy, but CuPy cannot use a GPU here: {problem}. "
                           f"Fix: unset {ENV} to use the simulator, or install CuPy "
                           f"for your CUDA version (pip install cupy-cuda12x).")
    else:
        chosen, reason = simulator, problem
    return chosen


def select(name):
    """Switch this process (and children started after) to backend `name`. For tests."""
    os.environ[ENV] = name
    forget()
    choose()


def forget():
    """Choose again at the next call (for tests: after they change ``$MPVIZ_CUDA_BACKEND``)."""
    global chosen
    chosen = None
