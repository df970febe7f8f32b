"""non-leaf-put: a tensor that is part of an autograd graph is put on a Queue: torch loses it.

What happens: a tensor computed from one that requires grad (``y = x * 2``) is a *non-leaf*: it
remembers how it was made, and that graph cannot cross a process boundary. torch refuses to
pickle it: "Cowardly refusing to serialize non-leaf tensor which requires_grad ... call
detach()". But ``Queue.put`` does not pickle: it hands the object to a background *feeder
thread*, which pickles later. The refusal is raised in that thread, printed to stderr, and the
item is dropped; ``put`` returned normally, and the consumer simply never gets it (pitfall #14)::

    torch                                           mpviz
    q.put(y)          returns ✓                     q.put(y)  ✗ RuntimeError: Cowardly refusing...
      feeder thread:  pickle(y) ✗ printed, dropped            (raised here, in the caller)
    q.put("end")      ──────────▶ consumer gets "end" first; y never comes

mpviz's ``put`` pickles in the caller, so the same refusal is raised where the mistake is.
``library='torch'`` runs the same program with real torch (when installed) to show its side.
``library='stdlib'`` shows it without torch: ``torch.multiprocessing.Queue`` *is* the stdlib's
``multiprocessing.Queue``, and with mpviz's reducers registered (as torch registers its own) that
class loses an mpviz tensor in its feeder thread the same way. (torch's ``SimpleQueue.put``
pickles in the caller too, and raises.)

The fix: send the data, not the graph: ``q.put(y.detach())`` (``detach=True``).
"""
from ._common import get, headline, step
from .base import Param

SUMMARY = "a non-leaf tensor that requires grad, put on a Queue: torch drops it, put does not raise"
PARAMS = {
    "library": Param("mpviz", ["mpviz", "torch", "stdlib"],
                     "mpviz (refuses at put); real torch, if installed (put returns; the feeder "
                     "thread prints the refusal and drops the item); stdlib: the stdlib Queue "
                     "(torch's Queue class) with mpviz tensors, which loses it as torch does"),
    "detach": Param(False, [False, True], "put y.detach() instead of y"),
}
STALL_SECONDS = 8.0         # importing torch takes a few seconds


def consume(q, out):
    """The consumer: report, in order, what arrived (a tensor's values, or the end marker)."""
    got = []
    while True:
        item = q.get(timeout=20)
        if isinstance(item, str):
            break
        got.append([float(v) for v in item.tolist()])
    out.put(got)


def drive(p, details):
    if p["library"] == "torch":
        try:
            import torch
            import torch.multiprocessing as mp
        except ImportError:
            details["torch_missing"] = True
            return
        details["torch_version"] = torch.__version__
        make = torch.ones
    else:
        import mpviz
        import mpviz.multiprocessing as mp          # registers mpviz's reducers, as torch does
        if p["library"] == "stdlib":
            import multiprocessing as mp            # noqa: F811 - the class torch's Queue is
        make = mpviz.ones
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q, out = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=consume, args=(q, out), name="consumer")
    consumer.start()
    x = make(3, requires_grad=True)
    y = x * 2                                       # a non-leaf: it has a grad_fn
    step("producer puts y = x * 2", detach=p["detach"])
    try:
        q.put(y.detach() if p["detach"] else y)
        details["put"] = "returned"
    except RuntimeError as exc:
        details["put"] = f"{type(exc).__name__}: {exc}"
    q.put("end")               # the feeder thread takes items in order: y's fate comes first
    details["consumer_got"] = get(out, timeout=20, what="the consumer's report", sender=consumer)
    consumer.join()


def verdict(t, details):
    prm = details["params"]
    if details.get("torch_missing"):
        return "error", ("torch is not installed here, so its side cannot be shown; "
                         "library='mpviz' shows mpviz's.")
    got = details["consumer_got"]
    if prm["detach"]:
        return "ok", (f"y.detach() is plain data, no graph: put returned and the consumer got "
                      f"it ({got}). Fix applied.")
    if details["put"] != "returned":
        return "error", (
            f"mpviz refused at put, in the producer's own line: {headline(details['put'])} "
            f"The consumer got only the end marker ({got}): nothing half-sent. (torch refuses "
            f"the same tensor, but in its feeder thread: library='torch'.) Fix: "
            f"q.put(y.detach()) (detach=True).")
    who = (f"torch {details['torch_version']}" if prm["library"] == "torch" else
           "The stdlib's multiprocessing.Queue (torch.multiprocessing.Queue is this class), "
           "carrying mpviz tensors")
    if not got:
        return "error", (
            f"{who}: q.put(y) returned normally, but y never "
            f"arrived: the consumer got the end marker first and nothing else ({got}). The "
            f"refusal ('Cowardly refusing to serialize non-leaf tensor which requires_grad') "
            f"was raised in the Queue's feeder thread, which printed it to stderr (in the "
            f"output) and dropped the item. Fix: q.put(y.detach()) (detach=True); torch's "
            f"SimpleQueue, which pickles in put, would have raised there.")
    return "ok", f"The consumer got {got}."
