"""strategies: file_descriptor vs file_system -- open fds, /dev/shm names, who maps what.

What happens: the parent shares ``count`` tensors with a child and both look at themselves the
way the operating system sees them (``mpviz.trace.os_view``: ``/proc/PID/maps`` and
``/proc/PID/fd``)::

                    file_descriptor (Linux default)          file_system
    the handle      "ask process P for its fd"               "/dev/shm/mpviz_3f9c..." (a name)
    in /dev/shm     nothing (the name is unlinked at once)   one file per shared storage
    in maps         /dev/shm/mpviz_fd_... (deleted)          /dev/shm/mpviz_...
    open fds        +1 per storage held, in every holder     +0 (mapped, fd closed)
    sender          must stay alive until received           may exit (the name outlives it)
    killed holder   nothing leaks (the kernel frees it)      the name leaks (the shm manager
                                                             removes it)

Neither is better everywhere: file_descriptor cannot leak but costs descriptors (see
``too-many-fds``) and needs a live sender (``producer-exits``); file_system scales to many tensors
but can leave files in /dev/shm (``fs-leak``). Choose with
``mpviz.multiprocessing.set_sharing_strategy``.
"""
import os

from .. import full
from ..trace import os_view
from ._common import check_between, context, get, start_method_param, step, strategy_param
from .base import Param

SUMMARY = "fd vs file_system: open fds, /dev/shm names, who maps what (/proc/PID/maps)"
PARAMS = {
    "strategy": strategy_param(),
    "count": Param(8, None, "how many tensors the parent shares with the child"),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    check_between(p, "count", 1, 200)


def _view(pid=None):
    v = os_view(pid)
    return {"pid": v.pid, "nfds": v.nfds, "mapped": sorted(n for n in v.shm if "mpviz" in n)}


def holder(q, out, count, done):
    before = _view()
    kept = [q.get() for _ in range(count)]
    step("child holds the tensors", count=len(kept))
    out.put({"before": before, "holding": _view(), "sum": float(sum(t.sum().item() for t in kept))})
    done.wait(20)
    del kept


def drive(p, details):
    ctx = context(p)
    q, out, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    child = ctx.Process(target=holder, args=(q, out, p["count"], done), name="child")
    child.start()
    parent_before = _view()
    tensors = [full((256,), float(i)) for i in range(p["count"])]
    for t in tensors:
        q.put(t)
    report = get(out, what="the child's view")
    details["child"] = report
    details["parent_before"], details["parent_holding"] = parent_before, _view()
    details["dev_shm"] = sorted(n for n in os.listdir("/dev/shm")
                                if "/" + n in _names(report["holding"]["mapped"]))
    step("both looked at /proc", child_fds=report["holding"]["nfds"])
    done.set()
    child.join()


def _names(mapped):
    return {"/" + m.lstrip("/") for m in mapped}


def verdict(t, details):
    strategy, count = details["params"]["strategy"], details["params"]["count"]
    c = details["child"]
    extra_fds = c["holding"]["nfds"] - c["before"]["nfds"]
    mapped = c["holding"]["mapped"]
    in_dev_shm = details.get("dev_shm", [])
    details["child_extra_fds"] = extra_fds
    text = (f"Under '{strategy}' the child, holding {count} shared tensors, has {extra_fds:+d} open "
            f"file descriptors and maps {len(mapped)} mpviz segment(s); {len(in_dev_shm)} of "
            f"them have a name in /dev/shm. ")
    if strategy == "file_descriptor":
        text += ("Each storage costs every holder one fd, and the segments are unlinked at "
                 "once: the maps show '/dev/shm/mpviz_fd_… (deleted)', nothing stays in "
                 "/dev/shm, nothing can leak. The price: fds (too-many-fds) and a live sender "
                 "(producer-exits).")
    else:
        text += ("Holders keep no fds: they map the segment by its name, which stays in "
                 "/dev/shm while anyone holds it, so a killed holder can leave it behind "
                 "(fs-leak; the shm manager cleans up).")
    return "ok", text
