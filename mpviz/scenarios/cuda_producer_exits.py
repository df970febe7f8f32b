"""cuda-producer-exits: the producer exits while a consumer still holds its CUDA tensor.

What happens: a CUDA tensor sent to another process is not copied: the consumer maps the
producer's own device memory through a CUDA IPC handle. That memory belongs to the producer and
dies with it. So the producer must stay alive until every consumer has let go (torch keeps a
reference count per sent block for that). If it exits first, torch prints
``Producer process has been terminated before all shared CUDA tensors released`` (pitfall #8),
and the consumer's tensor now points at freed memory -- on a GPU it reads garbage or faults; the
simulator fills freed blocks with 0xFF, so it reads NaN::

    producer  x = randn().cuda()  put(x) ── exits ✗  "terminated before all shared CUDA
                                                      tensors released"
    consumer                      get() → y (maps x's block) ........ y.sum() → nan ✗

This is the "bad practice" example of the tutorial "Multiprocessing in Python and PyTorch"
(the one notebook 01 follows). The fix: the producer waits (an
``Event`` the consumer sets when done, ``producer_waits=True``) and consumers ``del`` what they
received as soon as they can. Runs on the CUDA IPC simulator without a GPU.
"""
from ..cuda import examples
from ._common import get, get_read_and_release, step
from .base import Param

SUMMARY = ("producer exits while a consumer holds its CUDA tensor: the warning; "
           "use-after-free")
PARAMS = {
    "producer_waits": Param(False, [False, True],
                            "the producer waits on an Event until the consumer has released "
                            "the tensor"),
}
STALL_SECONDS = 5.0


def drive(p, details):
    import mpviz.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    got, later, released = ctx.Event(), ctx.Event(), ctx.Event()
    keep_alive = released if p["producer_waits"] else got
    prod = ctx.Process(target=examples.producer, args=(q, keep_alive), name="producer")
    cons = ctx.Process(target=examples.consumer, args=(q, out, None,
                                                       None if p["producer_waits"] else later),
                       name="consumer")
    prod.start()
    cons.start()
    details["got"] = get(out, what="the consumer's first report", sender=cons)
    got.set()                                # without waiting, the producer exits now
    if not p["producer_waits"]:
        prod.join()
        step("producer has exited; the consumer reads its tensor now")
        later.set()
    get_read_and_release(out, cons, details)
    released.set()
    prod.join()
    cons.join()
    details["exitcodes"] = [prod.exitcode, cons.exitcode]


def verdict(t, details):
    warnings = t.of_kind("cuda.warning")
    read = details.get("read") or ["read", None, None]
    valid, total = read[1], read[2]
    if warnings:
        return "warning", (
            f"The producer exited while the consumer still held its CUDA tensor: it printed "
            f"'{warnings[0].args.get('message', '')}' (the cuda.warning mark) and its memory was "
            f"freed. The consumer then read its tensor: valid={valid}, sum={total} -- "
            f"{'freed memory (the simulator poisons it: NaN)' if not valid else 'still readable'}"
            f". On a GPU that read is a use-after-free. Fix: the producer waits until consumers "
            f"are done (producer_waits=True), consumers del received tensors early.")
    return "ok", (f"The producer waited until the consumer had read (valid={valid}, sum={total:.3f})"
                  f" and released its tensor; then it exited with nothing still shared: no warning.")
