"""cuda-release-late: a consumer keeps a received CUDA tensor long; the producer's memory stays held.

What happens: the producer cannot free a block it sent while a consumer still holds it: the
block's reference count (a slot in a shared counter file) stays above 0, and when the producer's
own code lets go of the tensor the block waits in *limbo* instead of being freed. Memory the
producer no longer uses is still taken -- in a DataLoader-like pipeline, one block per batch a
consumer is slow to drop::

    producer  x.cuda() put(x) del x → limbo (count 1) ......... count 0 → ipc_collect() frees it
    consumer             get() → y  ....... keeps y ........... del y

``memory_stats()`` shows it (``held_for_consumers_bytes``, ``limbo_bytes``) and so does the
trace (``cuda.limbo`` → ``cuda.free``). The fix: consumers ``del`` what they received as soon as
they are done (``release_early=True``); producers call ``torch.cuda.ipc_collect()``
(``mpviz.cuda.ipc_collect()``) to free what has been released.
"""
import mpviz

from .. import cuda
from ..cuda import examples
from ._common import get, get_read_and_release, step
from .base import Param

SUMMARY = "consumer keeps a reference long: producer memory held (refcount view)"
PARAMS = {
    "release_early": Param(False, [False, True],
                           "the consumer dels the tensor before the producer looks"),
    "numel": Param(4096, None, "float32 elements in the tensor"),
}
STALL_SECONDS = 5.0


def producer_with_stats(q, out, look, keep_alive, numel):
    x = mpviz.randn(numel).cuda()
    q.put(x)
    del x                                     # the producer is done with it ...
    look.wait(20)
    cuda.ipc_collect()                        # ... free whatever nobody holds any more
    stats = cuda.memory_stats()
    step("producer looks at its memory", held=stats["held_for_consumers_bytes"])
    out.put(("stats", {k: stats[k] for k in ("allocated_bytes", "held_for_consumers_bytes",
                                            "limbo_blocks", "limbo_bytes")}))
    keep_alive.wait(20)
    cuda.ipc_collect()


def drive(p, details):
    import mpviz.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, pout, cout = ctx.Queue(), ctx.Queue(), ctx.Queue()
    look, release, keep_alive = ctx.Event(), ctx.Event(), ctx.Event()
    prod = ctx.Process(target=producer_with_stats,
                       args=(q, pout, look, keep_alive, p["numel"]), name="producer")
    cons = ctx.Process(target=examples.consumer, args=(q, cout, release), name="consumer")
    prod.start()
    cons.start()
    details["got"] = get(cout, what="the consumer's first report", sender=cons)
    if p["release_early"]:
        release.set()
        get_read_and_release(cout, cons, details)
    look.set()
    details["producer_stats"] = get(pout, what="the producer's memory stats", sender=prod)[1]
    if not p["release_early"]:
        release.set()
        get_read_and_release(cout, cons, details)
    keep_alive.set()
    prod.join()
    cons.join()


def verdict(t, details):
    s = details.get("producer_stats", {})
    held = s.get("held_for_consumers_bytes", 0)
    limbo = t.of_kind("cuda.limbo")
    if held:
        return "warning", (
            f"When the producer looked (after its own del and an ipc_collect()), "
            f"{held:,} bytes of its CUDA memory were still held for the consumer "
            f"({s.get('limbo_blocks')} block(s) in limbo: the cuda.limbo mark, freed only later, "
            f"after the consumer's del). The refcount kept it alive, as it must. Fix: consumers "
            f"del received tensors as soon as they are done (release_early=True), and the "
            f"producer calls ipc_collect().")
    return "ok", (f"The consumer deleted its tensor early; the producer's ipc_collect() then freed "
                  f"the block ({len(limbo)} limbo event(s) in the trace), and its memory_stats show "
                  f"0 bytes held for consumers.")
