"""autograd-fork: the parent ran backward() on a machine with a GPU, then forked: the child's fails.

What happens: on its first ``backward()`` on a machine with a GPU, torch's autograd engine
starts one worker thread per device. ``fork()`` copies the engine's state into the child, but
not those threads, so the engine registers an at-fork handler that marks every child forked
from then on, and ``backward()`` in a marked child raises (pitfall #9)::

    parent  x = w.cuda(); loss.backward()   ← the engine starts its device threads
            fork() ──────────────────────────── join()
    child (fork)      loss.backward()  ✗ RuntimeError: Unable to handle autograd's threading in
                                         combination with fork-based multiprocessing
    child (spawn)     loss.backward()  ✓ a fresh interpreter, a fresh engine

The child's own tensors may be on the CPU: the mark is on the process, not on a tensor. torch
counts the GPUs the machine *has*: on a machine with a GPU, a parent whose backward used only CPU
tensors marks its forked children too. On a machine *without* a GPU torch starts no device
threads, marks nothing, and the forked child's backward works (torch 2.13 CPU, observed). mpviz's
autograd keeps the rule (``mpviz/autograd.py``, "fork safety") but has no GPU to count: it counts
``mpviz.cuda`` -- the simulator or a GPU -- as present once the process has used it, so
``device='cpu'`` here plays a machine without a GPU.

The fix: start the workers with ``spawn`` or ``forkserver``; or fork them before the parent's
first ``backward()``.
"""
from ._common import context, get, start_method_param, step
from .base import Param

SUMMARY = "backward() in a child forked after the parent ran backward() on a machine with a GPU"
PARAMS = {
    "start_method": start_method_param(
        "fork", "fork copies the engine without its threads (error); spawn and forkserver "
                "give the child a fresh engine (ok)"),
    "device": Param("cuda", ["cuda", "cpu"],
                    "where the parent's backward runs: cuda (the engine starts device threads) "
                    "or cpu, which plays a machine without a GPU (no device threads: a forked "
                    "child's backward works, as in CPU-only torch; torch on a GPU machine would "
                    "mark it all the same)"),
}
STALL_SECONDS = 6.0


def child_backward(out):
    """The child: a small backward() on its own CPU tensors."""
    import mpviz
    w = mpviz.ones(3, requires_grad=True)
    step("child calls backward()")
    try:
        (w * 2.0).sum().backward()
        out.put(("ok", w.grad.tolist()))
    except RuntimeError as exc:
        out.put((type(exc).__name__, str(exc)))


def drive(p, details):
    import mpviz
    ctx = context(p)
    w = mpviz.randn(4)
    if p["device"] == "cuda":
        w = w.cuda()
    w.requires_grad_()
    (w * w).sum().backward()                     # the parent trains a step first
    details["parent_grad_shape"] = list(w.grad.shape)
    step("parent ran backward(); now it starts a child", device=p["device"],
         start_method=p["start_method"])
    out = ctx.Queue()
    child = ctx.Process(target=child_backward, args=(out,), name="worker")
    child.start()
    details["child"] = get(out, what="the child's report", sender=child)
    child.join()
    details["child_exitcode"] = child.exitcode


def verdict(t, details):
    prm = details["params"]
    kind, said = details["child"]
    if kind != "ok":
        return "error", (
            f"The parent ran backward() with a CUDA device in use: at that moment torch's autograd "
            f"engine starts a thread per GPU and marks every child forked after that (torch does "
            f"so on any machine with a GPU, even for a backward on CPU tensors; mpviz keeps the "
            f"rule, with an at-fork mark, once the process has used mpviz.cuda). The worker, "
            f"started with '{prm['start_method']}', is such a child, and its backward() raised "
            f"{kind}: \"{said.split(' (mpviz:')[0]}\" (torch's RuntimeError, word for word), "
            f"although the child's own tensors were on the CPU. Fix: start workers with spawn "
            f"or forkserver (start_method='spawn'), or fork them before the first backward().")
    if prm["device"] == "cpu" and prm["start_method"] == "fork":
        why = ("the parent's backward ran with no CUDA device in use, so nothing marked the child. "
               "That plays a machine without a GPU, where torch starts no device threads and "
               "behaves the same; on a machine with a GPU, torch's engine counts the GPUs "
               "present, not the ones used, and would have marked the child all the same")
    elif prm["start_method"] == "spawn":
        why = "under 'spawn' the worker is a fresh interpreter with an engine of its own"
    else:
        why = (f"under '{prm['start_method']}' the worker is forked from the fork server, a "
               f"fresh interpreter that never ran backward(), so nothing marked it")
    return "ok", f"The worker's backward() worked (grad {said}): {why}."
