"""cuda-same-queue: one process puts a CUDA tensor on a queue and gets it back itself.

What happens: a CUDA IPC handle is meant for *another* process: opening one's own allocation
through it is an error in the CUDA driver, and torch's notes warn that it "will likely end up
with segfault". mpviz raises ``CudaSameProcessError`` instead, saying what to do::

    process A   t = ones(3).cuda()   q.put(t)   q.get() ✗ its own handle

The fix: use two queues, one per direction (each process gets only from the queue the *other*
one puts on) -- or, within one process, just keep using the tensor you have
(``two_queues=True``, what ``mpviz.cuda.examples.same_queue`` does then).
"""
from ..cuda import examples
from ._common import get
from .base import Param

SUMMARY = "one process puts and gets a CUDA tensor on one queue"
PARAMS = {
    "two_queues": Param(False, [False, True],
                        "don't get your own tensor back (one queue per direction)"),
}
STALL_SECONDS = 5.0


def drive(p, details):
    import mpviz.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=examples.same_queue, args=(out, p["two_queues"]), name="process A")
    child.start()
    details["status"], details["message"] = get(out, what="the child's report", sender=child)
    child.join()


def verdict(t, details):
    if details.get("status") == "refused":
        return "error", (f"The process got its own CUDA tensor back from the queue and was "
                         f"refused: {details['message']}")
    return "ok", (f"The process kept using the tensor it had (sum {details.get('message')}) "
                  f"instead of sending it to itself; between two processes, one queue per "
                  f"direction does the same.")
