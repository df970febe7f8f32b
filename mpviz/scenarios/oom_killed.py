"""oom-killed: the workers together need more memory than the job may use; the kernel SIGKILLs one.

What happens: each worker loads its data; their memory grows together. A container (or a job
scheduler) gives the job a memory limit -- a *memory cgroup*. When the processes in it together
pass the limit, the kernel's OOM killer picks the process using the most memory and kills it
with SIGKILL: no exception, no traceback, nothing in the worker's own output. ``spawn`` only sees
a child that died of a signal (pitfall #4)::

    memory limit ─────────────────────────────────────────── 256 MiB (all workers together)
    rank 0  ▁▂▃▄▅▆  ✗ SIGKILL by the kernel (the largest)
    rank 1  ▁▂▃▄▅   ✗ SIGTERM by spawn
    rank 2  ▁▂▃▄▅   ✗ SIGTERM by spawn
    parent  ProcessExitedException: process 0 terminated with signal SIGKILL

torch's ``spawn`` raises exactly that; the only trace of the cause is in the kernel log
(``dmesg``: "Memory cgroup out of memory: Killed process N"). The driver here samples each
worker's resident memory (VmRSS in ``/proc/PID/status``) as it grows and records it as
``mem.rss`` events; :func:`mpviz.viz.rss.rss_lanes` draws them.

The fix: use less memory per worker (``mb_per_worker=60``: load less, in smaller pieces, or
share one copy: ``share_memory_()``), fewer workers (``nprocs=2``), or a bigger limit; check
``dmesg`` when a worker dies of SIGKILL.
"""
import os
import time

from ..memory_cgroup import make_cgroup, oom_kills, play_oom_killer, remove_cgroup
from ..memory_cgroup import rss as _rss
from ._common import check_between, step
from .base import Param

SUMMARY = "workers outgrow the memory limit: the OOM killer SIGKILLs one"
PARAMS = {
    "nprocs": Param(3, None, "workers started by spawn"),
    "mb_per_worker": Param(120, None, "MiB each worker loads, 10 MiB at a time"),
    "limit_mb": Param(256, None, "memory limit of all workers together, in MiB"),
    "limit": Param("auto", ["auto", "cgroup", "watchdog"],
                   "cgroup: a real memory cgroup (root, cgroup v1 or v2 with the memory "
                   "controller); watchdog: the driver SIGKILLs the largest worker past the "
                   "limit; auto: cgroup where one can be made"),
}
STALL_SECONDS = 6.0
STEP_MB = 10
SAMPLE_SECONDS = 0.05


def check_params(p):
    check_between(p, "nprocs", 1, 4)
    check_between(p, "mb_per_worker", 10, 300, " (MiB)")
    check_between(p, "limit_mb", 64, 1024, " (MiB)")


# -- the workers --------------------------------------------------------------------------------

def load_data(rank, procs_file, mb, ready):
    """One worker: join the cgroup (if any), then load `mb` MiB, 10 MiB at a time, and hold it."""
    import numpy as np
    if procs_file:
        with open(procs_file, "w") as f:       # from now on the kernel charges our memory there
            f.write(str(os.getpid()))
    ready.put((rank, _rss(os.getpid())))
    data = []
    for loaded in range(STEP_MB, mb + 1, STEP_MB):
        data.append(np.ones(STEP_MB << 20, dtype=np.uint8))     # ones(): every page is touched
        step("rank loaded data", rank=rank, mib=loaded)
        time.sleep(0.05)
    step("rank holds all its data", rank=rank)
    time.sleep(1.0)


# -- the driver: start, sample each worker's memory, play the OOM killer if there is no cgroup -----

def drive(p, details):
    """Where the limit comes from (``limit`` parameter): as root, with a memory cgroup controller
    mounted (v1 or v2), the case makes a real memory cgroup of ``limit_mb`` and each worker moves
    itself into it, so it is the kernel's OOM killer that acts. Where that cannot be done, the
    driver plays the OOM killer: when the workers' memory grown since they joined (the part a
    cgroup would have charged) passes ``limit_mb``, it SIGKILLs the largest. The verdict says
    which."""
    import mpviz.multiprocessing as mp
    from ..trace import recorder
    limit = p["limit_mb"] << 20
    cgroup, version, why = None, None, ""
    if p["limit"] != "watchdog":
        try:
            cgroup, version = make_cgroup(limit)
        except OSError as exc:
            why = str(exc)
            if p["limit"] == "cgroup":
                raise RuntimeError(f"limit='cgroup' cannot run here: {why}; use 'watchdog'")
    details.update(where="cgroup" if cgroup else "watchdog", cgroup_version=version, why=why)
    procs_file = os.path.join(cgroup, "cgroup.procs") if cgroup else None
    ready = mp.get_context("spawn").SimpleQueue()
    step("start the workers", nprocs=p["nprocs"], limit_mb=p["limit_mb"], where=details["where"])
    ctx = mp.spawn(load_data, args=(procs_file, p["mb_per_worker"], ready), nprocs=p["nprocs"],
                   join=False)
    pids = ctx.pids()
    base = dict(ready.get() for _ in pids)          # each worker's memory when it joined
    details["rss_at_join"] = [base[r] for r in range(len(pids))]
    last, peaks, killed_by_us = {}, {}, None
    try:
        while not ctx.join(timeout=SAMPLE_SECONDS):
            now = {r: _rss(pid) for r, pid in enumerate(pids)}
            for r, rss in now.items():
                if rss is not None and abs(rss - last.get(r, -1 << 40)) >= 4 << 20:
                    last[r] = rss
                    recorder.emit("mem.rss", of=pids[r], rank=r, rss=rss)
                    peaks[r] = max(peaks.get(r, 0), rss)
            if cgroup is None and killed_by_us is None:
                victim = play_oom_killer({pids[r]: v for r, v in now.items()},
                                         {pids[r]: v for r, v in base.items()}, limit)
                if victim is not None:
                    killed_by_us = pids.index(victim)
                    step("watchdog: over the limit, SIGKILLed the largest worker",
                         rank=killed_by_us)
        details["raised"] = None
    except mp.ProcessExitedException as exc:
        details.update(raised=type(exc).__name__, message=str(exc), error_index=exc.error_index,
                       exit_code=exc.exit_code, signal_name=exc.signal_name)
    details["peak_rss"] = [peaks.get(r, 0) for r in range(len(pids))]
    details["killed_by_watchdog"] = killed_by_us
    if cgroup:
        details["oom_kills"] = oom_kills(cgroup, version)
        details["cgroup_removed"] = remove_cgroup(cgroup)


def verdict(t, details):
    prm = details["params"]
    error = bool(details["raised"])
    if details["where"] == "cgroup":
        where = (f"a real memory cgroup (cgroup {details['cgroup_version']}) of {prm['limit_mb']} "
                 f"MiB for the workers together, enforced by the kernel"
                 + (f"; its OOM killer acted (oom_kill count: {details.get('oom_kills')})"
                    if error else ""))
        cause = ("Only the kernel log (dmesg: 'Memory cgroup out of memory: Killed process ...') "
                 "names the cause.")
    else:
        where = (f"a {prm['limit_mb']} MiB limit that mpviz's driver enforced by sampling /proc "
                 f"and SIGKILLing the largest worker, as the OOM killer would"
                 + (f" (no real cgroup could be made here: {details['why']})"
                    if details["why"] else " (limit='watchdog')"))
        cause = ("After a real OOM kill only the kernel log (dmesg: 'Memory cgroup out of "
                 "memory: Killed process ...') names the cause.")
    need = f"{prm['nprocs']} workers x {prm['mb_per_worker']} MiB"
    peaks = ", ".join(f"{b >> 20}" for b in details["peak_rss"])
    before = max(details["rss_at_join"]) >> 20
    sampled = (f"peak resident MiB per rank, as sampled: {peaks}, each including up to {before} "
               f"MiB of Python and NumPy that it had before it joined and that the limit does "
               f"not count")
    if error:
        n = (details.get("oom_kills") or 1) if details["where"] == "cgroup" else 1
        who = "one was" if n == 1 else f"{n} were"      # the kernel may take more than one
        return "error", (
            f"Limit: {where}. The workers needed {need}; while their memory grew ({sampled}), "
            f"{who} killed with SIGKILL -- no exception, no traceback -- and spawn raised "
            f"{details['raised']}: \"{details['message']}\" (torch's words), then terminated "
            f"the others. {cause} Fix: less memory per worker (mb_per_worker=60; load in "
            f"pieces, or share one copy with share_memory_()), fewer workers (nprocs=2), or a "
            f"larger limit.")
    return "ok", (f"Limit: {where}. The workers needed {need} and fitted ({sampled}); every "
                  f"worker finished.")
