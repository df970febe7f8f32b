"""Real torch beside the lesson: run a lesson's program in real torch, traced by mpviz, and draw
its picture beside the one mpviz's own run drew.

Each lesson teaches on mpviz (torch's names on NumPy). To show that what it teaches is what torch
does, the lesson's central program also exists as a plain torch script in ``notebooks/programs/``
(``torch_*.py``; it knows nothing of mpviz). The notebook runs it as you would from a shell,
under ``python -m mpviz trace`` (notebook 10), so the kernel forks nothing, and draws both::

    theirs = torch_run("torch_buffer_reuse.py", "reuse")   # None, after one line, without torch
    if theirs:
        beside(ours.trace, theirs.trace, "mpviz: ...", "torch: ...")     # one Figure, two rows

Notebooks 01-04 run theirs in the kernel instead, under ``mpviz.trace.record()``
(``torch_basics.py``): their mpviz runs are in the kernel too, and 04's lesson is the kernel's
own threads at a fork.

What the torch run records comes from mpviz's hooks into torch (``mpviz.trace.torch_hooks``):
the same event kinds as mpviz's own (copies, handles, fds), so the same picture can be drawn.
"""
import importlib.util

from matplotlib.figure import Figure

from .. import viz
from ..scenarios.small_shm import _can_make_tmpfs
from .your_program import trace_program

__all__ = ["torch_run", "beside", "torch_version"]


def torch_version():
    """The installed torch's version, or None (without importing torch into this kernel)."""
    if importlib.util.find_spec("torch") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def torch_run(script, *args, shm_mb=None, **kwargs):
    """``trace_program(script, *args)`` when torch is installed; else one line saying why the
    comparison is skipped, and None. (The kernel imports no torch: the program does.)

    `shm_mb`: run it as in a container whose ``/dev/shm`` is that many MiB: in a private mount
    namespace with a fresh tmpfs of that size on ``/dev/shm`` (root only, as the ``small-shm``
    scenario does; nothing outside sees the mount, and it vanishes with the run). Where that
    cannot be made, one line says why, and None."""
    if torch_version() is None:
        print("torch is not installed here: the real-torch run of this lesson is skipped "
              "(pip install torch==2.13.0, then restart the kernel, to see it).")
        return None
    if shm_mb is not None:
        possible, why_not = _can_make_tmpfs()
        if not possible:
            print(f"a private {shm_mb} MiB /dev/shm cannot be made here ({why_not}): the "
                  f"real-torch run of this lesson is skipped.")
            return None
        mount = 'mount -t tmpfs -o "size=$1,mode=1777" tmpfs /dev/shm || exit 97; shift; exec "$@"'
        kwargs["wrap"] = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          mount, "sh", f"{shm_mb}m"]
    return trace_program(script, *args, **kwargs)


def beside(ours, theirs, ours_title, theirs_title, draw=None, **kwargs):
    """One Figure: `draw(ours)` on top, `draw(theirs)` under it, each with its title.

    `draw`: a picture of ``mpviz.viz`` that takes ``ax=`` (default: ``timeline``); `kwargs` go
    to it. Each row is as tall as its picture wants alone, so the lanes keep their height."""
    draw = draw or viz.timeline
    alone = [draw(t, title=title, **kwargs).get_figheight()
             for t, title in ((ours, ours_title), (theirs, theirs_title))]
    fig = Figure(figsize=(10, sum(alone)), layout="constrained")
    for sub, trace, title in zip(fig.subfigures(2, 1, height_ratios=alone),
                                 (ours, theirs), (ours_title, theirs_title)):
        draw(trace, ax=sub.add_subplot(), title=title, **kwargs)
    return fig
