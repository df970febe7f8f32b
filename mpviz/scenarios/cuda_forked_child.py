"""cuda-in-forked-child: the parent used CUDA, then forked; the child cannot use CUDA.

What happens: the first CUDA call of a process creates its CUDA *context* -- driver state,
device memory mappings, helper threads. ``fork()`` copies the parent's memory, so the child
gets a copy of the parent's context, but not its threads, and the driver does not support a
context used from two processes. torch therefore marks a forked child of a process that had
initialised CUDA (an at-fork handler), and the child's first CUDA call raises (pitfall #3)::

    parent   x = ones(4).cuda()   fork() ──────────────────── join()
                 CUDA initialised    │
    child (fork)                     └─ ones(2).cuda()  ✗ RuntimeError: Cannot re-initialize
                                        CUDA in forked subprocess. To use CUDA with
                                        multiprocessing, you must use the 'spawn' start method
    child (spawn)                       a fresh interpreter: initialises CUDA itself ✓

Users meet it in DataLoader workers and ``Pool``s (Linux's default start method is fork) after
the main process has touched the GPU. mpviz's CUDA (the simulator here, CuPy on a GPU) keeps
the same rule (``mpviz/cuda/ipc.py``, rule 6) and raises ``CudaForkError`` with torch's text.

The fix: start the workers with ``spawn`` (or ``forkserver``): ``mp.get_context("spawn")``,
or ``DataLoader(..., multiprocessing_context="spawn")``.
"""
from ._common import context, get, start_method_param, step

SUMMARY = "the parent used CUDA, then forked: the child cannot use CUDA"
PARAMS = {
    "start_method": start_method_param(
        "fork", "fork copies the parent's CUDA state and the child refuses CUDA (error); spawn "
                "and forkserver start a fresh interpreter that initialises CUDA itself (ok)"),
}
STALL_SECONDS = 6.0       # a spawned child imports mpviz and the CUDA backend first


def use_cuda(out):
    """The child: put a tensor on the GPU and report what happened."""
    import mpviz
    step("child calls .cuda()")
    try:
        y = mpviz.ones(2).cuda()
        out.put(("ok", float(y.sum().item())))
    except RuntimeError as exc:
        out.put((type(exc).__name__, str(exc)))


def drive(p, details):
    import mpviz
    ctx = context(p)
    x = mpviz.ones(4).cuda()            # the parent initialises CUDA ...
    details["backend"] = mpviz.cuda.backend()
    step("parent used CUDA; now it starts a child", start_method=p["start_method"])
    out = ctx.Queue()
    child = ctx.Process(target=use_cuda, args=(out,), name="worker")   # ... then starts a child
    child.start()
    details["child"] = get(out, what="the child's report", sender=child)
    child.join()
    details["child_exitcode"] = child.exitcode
    del x


def verdict(t, details):
    method = details["params"]["start_method"]
    kind, said = details["child"]
    if kind != "ok":
        return "error", (
            f"The parent put a tensor on the GPU ({details['backend']}), which initialised CUDA "
            f"in it, and then started the worker with '{method}': the worker is a copy of a "
            f"process with live CUDA state it cannot use, so its first .cuda() raised "
            f"{kind}: \"{said.split(' (mpviz:')[0]}\" (torch raises the same RuntimeError). "
            f"Fix: start workers with spawn or forkserver (here: start_method='spawn'; in your "
            f"code: mp.get_context('spawn'), or DataLoader's multiprocessing_context='spawn').")
    fresh = ("a fresh interpreter" if method == "spawn" else
             "a fork of the fork server, a fresh interpreter that never used CUDA")
    return "ok", (
        f"The parent used CUDA first, but under '{method}' the worker is {fresh}: it "
        f"initialised CUDA itself and used it (sum {said:.0f}). Compare start_method='fork'.")
