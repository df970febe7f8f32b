"""spawn-error: one rank raises; ``spawn`` terminates the others and the traceback arrives.

What happens: ``mp.spawn(fn, nprocs=N)`` runs ``fn(i, ...)`` in N processes and watches them all
at once (joining them one by one would hang on a healthy rank while another had crashed). A
child that raises writes its traceback into its error pipe and exits with 1; the parent sees it,
SIGTERMs the other ranks (then SIGKILLs what ignores SIGTERM), and raises
``ProcessRaisedException`` whose message is the child's traceback::

    rank 0  work ─ work ─ work ─ SIGTERM ✗
    rank 1  work ─ raise ValueError ─ error pipe, exit 1
    rank 2  work ─ work ─ work ─ SIGTERM ✗
    parent  join() ─────────── sees rank 1 → terminate 0 and 2 → raise ProcessRaisedException

So one failing rank fails the job quickly and loudly, with the real traceback, instead of a
silent hang. (The timeline shows the SIGTERMed lanes ending at the same instant.)
"""
import time

from ._common import check_between, step
from .base import Param

SUMMARY = "one rank raises: the others are terminated, the traceback arrives"
PARAMS = {
    "nprocs": Param(3, None, "how many ranks spawn starts"),
    "failing_rank": Param(1, None, "the rank that raises (-1: none, everything succeeds)"),
    "steps": Param(10, None, "work steps per rank (0.1 s each)"),
}


def check_params(p):
    check_between(p, "nprocs", 1, 6)
    if not -1 <= p["failing_rank"] < p["nprocs"]:
        raise ValueError(f"failing_rank must be -1 (none) or a rank below nprocs={p['nprocs']}, "
                         f"got {p['failing_rank']}")
    check_between(p, "steps", 1, 100)


def work(rank, failing_rank, steps):
    for i in range(steps):
        if rank == failing_rank and i == 2:
            raise ValueError(f"boom from rank {rank}")
        step("rank works", rank=rank, step=i)
        time.sleep(0.1)


def drive(p, details):
    import mpviz.multiprocessing as mp
    try:
        mp.spawn(work, args=(p["failing_rank"], p["steps"]), nprocs=p["nprocs"], join=True)
        details["raised"] = None
    except mp.ProcessRaisedException as exc:
        details["raised"] = type(exc).__name__
        details["error_index"] = exc.error_index
        details["message_tail"] = str(exc).strip().splitlines()[-1]


def verdict(t, details):
    reaped = [e.args for e in t.of_kind("process.reaped") if e.pid == details.get("driver_pid")]
    terminated = [a["child"] for a in reaped if a.get("signal") in ("SIGTERM", "SIGKILL")]
    if details.get("raised"):
        return "error", (
            f"Rank {details['error_index']} raised; spawn noticed at once, terminated the "
            f"{len(terminated)} other rank(s) still working (their lanes end together, by "
            f"SIGTERM), and raised {details['raised']} in the parent with the child's traceback, "
            f"ending in: {details['message_tail']}. That is the point of spawn over "
            f"start()/join() by hand: failures surface, nothing hangs.")
    return "ok", (f"All {details['params']['nprocs']} ranks finished their work and exited with "
                  f"0; spawn returned normally.")
