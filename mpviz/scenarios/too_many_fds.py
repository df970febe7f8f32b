"""too-many-fds: under file_descriptor, holding many tensors under a low fd limit fails.

What happens: under the ``file_descriptor`` strategy every shared storage a process holds keeps
one file descriptor open in that process (the segment has no name; the descriptor *is* the
memory). A process may open only ``RLIMIT_NOFILE`` descriptors (``ulimit -n``; often 1024, here
lowered in the receiver to ``limit``). A consumer that keeps many received tensors -- a list of
batches, a cache -- runs out, and the next ``get`` fails: torch says ``received 0 items of
ancdata`` or ``Too many open files``; mpviz raises ``TooManyFdsError`` (an ``OSError`` 24) that
says which. This is pitfall #1 of torch.multiprocessing::

    consumer (limit 48)   get() get() get() ...  get()   ✗ EMFILE: too many open files
    open fds              14    15    16    ...  near 48 (a get needs a few spare fds)

The fixes: hold fewer tensors at once (copy or ``del`` what you keep), raise the limit
(``ulimit -n 65536``), or ``set_sharing_strategy('file_system')``, where holders keep no fds.
"""
import resource

from .. import zeros
from ..trace import os_view
from ._common import check_between, headline, context, get, start_method_param, step, strategy_param
from .base import Param

SUMMARY = "file_descriptor with many tensors under a low fd limit → Too many open files"
PARAMS = {
    "strategy": strategy_param("file_descriptor", "file_system holds by name: no fds, no error"),
    "count": Param(100, None, "how many tensors the consumer receives and keeps"),
    "limit": Param(48, None, "the consumer's RLIMIT_NOFILE (its fd limit)"),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    check_between(p, "limit", 20, 1024)
    check_between(p, "count", 1, 2000)


def _nfds():
    try:
        return os_view().nfds
    except OSError:          # reading /proc needs a descriptor too
        return None


def hold_many(q, out, count, limit):
    """Lower our own fd limit, then receive and keep `count` tensors."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    start_fds = _nfds()
    step("consumer lowered its fd limit", limit=limit, open_fds=start_fds)
    kept, peak, error = [], start_fds, None
    try:
        for i in range(count):
            kept.append(q.get())
            if i % 10 == 9:
                peak = max(peak, _nfds() or 0)
                step("consumer holds", tensors=len(kept), open_fds=peak)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
        step("consumer ran out of file descriptors", tensors=len(kept))
    peak = max(peak, _nfds() or 0)
    received = len(kept)
    del kept[:]                         # give the descriptors back, then drain the rest
    for _ in range(count - received - (1 if error else 0)):
        try:
            q.get()
        except OSError:
            pass
    out.put({"received": received, "error": error, "start_fds": start_fds, "peak_fds": peak})


def drive(p, details):
    ctx = context(p)
    q, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=hold_many, args=(q, out, p["count"], p["limit"]), name="consumer")
    child.start()
    tensors = [zeros(4) for _ in range(p["count"])]
    for t in tensors:
        q.put(t)
    step("producer put all tensors", count=len(tensors))
    details.update(get(out, timeout=25, what="the consumer's report", sender=child))
    child.join()


def verdict(t, details):
    prm = details["params"]
    if details.get("error"):
        return "error", (
            f"Under 'file_descriptor' the consumer held one open fd per received tensor: from "
            f"{details['start_fds']} to {details['peak_fds']} at its limit of {prm['limit']}, and "
            f"the get of tensor #{details['received'] + 1} failed with {headline(details['error'])}"
            f" Fix: keep fewer tensors alive (copy "
            f"or del them), raise `ulimit -n`, or use strategy='file_system'.")
    if details.get("received") == prm["count"]:
        return "ok", (
            f"The consumer kept all {prm['count']} tensors under a limit of {prm['limit']} fds "
            f"(open fds: {details['start_fds']} → peak {details['peak_fds']}). Under "
            f"'{prm['strategy']}' "
            + ("holders map segments by name and keep no descriptors." if
               prm["strategy"] == "file_system" else "that many fit under the limit."))
    return "error", f"Unexpected end: {details}"
