"""pool-chunksize: ``Pool.map`` cuts the work into chunks; the last chunk can leave a worker idle.

The example of the tutorial "Multiprocessing in Python and PyTorch" (the one notebook 01
follows), with its seconds scaled down to ``unit``: 10 items, each
taking 2 units, on 2 workers. ``map`` sends the items in chunks; with ``chunksize=None`` it
picks ``ceil(10 / (4 * 2)) = 2``, so 5 chunks of 2 items (4 units each)::

    chunksize=None (2)   worker A  [0,1][4,5][8,9]        → 12 units: in the last round
                         worker B  [2,3][6,7]  idle         one worker has nothing to do
    chunksize=1 or 5     worker A  [0][2][4][6][8]        → 10 units: both busy to the end
                         worker B  [1][3][5][7][9]

Why: a chunk is the unit of scheduling -- a worker takes a whole chunk. An odd number of
chunks on two workers leaves one idle at the end. Bigger chunks cost less overhead (one message
per chunk), smaller ones balance better; choose ``chunksize`` so the chunks divide evenly among
the workers, or use small chunks when items take long.
"""
import math
import time

from ._common import check_between, context, start_method_param, step
from .base import Param

SUMMARY = "map chunking on 2 workers: 12 vs 10 time units (the tutorial's example)"
PARAMS = {
    "chunksize": Param(None, [None, 1, 2, 3, 4, 5, 10],
                       "items per chunk (None: let Pool choose, which gives 2 here)"),
    "items": Param(10, None, "how many items map() processes"),
    "processes": Param(2, None, "workers in the pool"),
    "unit": Param(0.1, None, "seconds per tutorial second (each item takes 2 units)"),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    check_between(p, "items", 1, 40)
    check_between(p, "processes", 1, 4)
    check_between(p, "unit", 0.02, 1, " seconds")
    # the busiest worker's time: whole chunks, so the items need not share out evenly
    # (chunksize=10 on 2 workers: one worker takes all 10 items)
    size = p["chunksize"] or math.ceil(p["items"] / (4 * p["processes"]))
    rounds = math.ceil(math.ceil(p["items"] / size) / p["processes"])
    longest = rounds * min(size, p["items"]) * 2 * p["unit"]
    if longest > 15:
        raise ValueError(f"the whole map must take at most 15 s, got up to {longest:.1f} s: the "
                         f"busiest worker runs {rounds} chunk(s) of up to {min(size, p['items'])}"
                         f" item(s), 2 units each. Fix: fewer items, a smaller unit, a smaller "
                         f"chunksize or more processes")


def foo(x, unit=0.1):
    time.sleep(2 * unit)               # the tutorial's time.sleep(2), scaled
    return x


def _foo(x):
    return foo(x, _UNIT)


_UNIT = 0.1


def _set_unit(unit):
    global _UNIT
    _UNIT = unit


def drive(p, details):
    ctx = context(p)
    with ctx.Pool(processes=p["processes"], initializer=_set_unit, initargs=(p["unit"],)) as pool:
        step("map starts", chunksize=p["chunksize"])
        t0 = time.monotonic()
        result = pool.map(_foo, range(p["items"]), chunksize=p["chunksize"])
        details["map_seconds"] = round(time.monotonic() - t0, 3)
        step("map returned")
    details["result_ok"] = result == list(range(p["items"]))


def verdict(t, details):
    prm = details["params"]
    unit = prm["unit"]
    starts = [e for e in t.of_kind("pool.task") if e.args.get("phase") == "start"]
    dones = [e for e in t.of_kind("pool.task") if e.args.get("phase") == "done"]
    if not starts or not dones:
        return "error", "No pool task was recorded."
    first, end = min(e.ts_ns for e in starts), max(e.ts_ns for e in dones)
    makespan = (end - first) / 1e9 / unit
    # Idle at the end, per worker: from its last chunk's end to map's end. A worker that got
    # no chunk at all sat idle from the first chunk's start.
    last_done = {}
    for e in dones:
        last_done[e.pid] = max(last_done.get(e.pid, 0), e.ts_ns)
    idle = [(end - ts) / 1e9 / unit for ts in last_done.values()]
    idle += [makespan] * max(0, prm["processes"] - len(last_done))
    chunks = sorted({e.args.get("chunk") for e in starts})
    ideal = prm["items"] * 2 / prm["processes"]
    best = _makespan(prm["items"], prm["processes"], 1)   # whole items: no chunksize does better
    details.update(makespan_units=round(makespan, 2), ideal_units=ideal, best_units=best,
                   chunks=len(starts), chunk_sizes=chunks, idle_units=round(max(idle), 2))
    text = (f"map cut {prm['items']} items into {len(starts)} chunk(s) of {chunks} item(s) for "
            f"{prm['processes']} workers; from the first chunk's start to the last one's end "
            f"took {makespan:.1f} units (each item takes 2; perfect balance would be "
            f"{ideal:g}" + (f", and {best:g} is the best whole items allow" if best > ideal
                            else "") + "). ")
    # Idleness is judged by the gap itself, not by the total: on a busy machine every chunk
    # starts a little late and the total grows with no worker idle. A gap costs time only where
    # the run took longer than whole items allow (10 items on 3 workers: one worker does 4,
    # and the others idle for one item whatever the chunksize).
    if makespan > best + 1 and max(idle) > 2.5:
        good = [c for c in range(1, prm["items"] + 1)
                if _makespan(prm["items"], prm["processes"], c) == best]
        return "warning", text + (
            f"In the last round a worker had no chunk left and sat idle for {max(idle):.1f} "
            f"units (the gap at the end of its lane) while the others finished. Fix: pick a "
            f"chunksize that divides the chunks evenly among the workers "
            f"({' or '.join(f'chunksize={c}' for c in good[:3])} here).")
    if makespan > best + 1:
        return "ok", text + (
            f"No worker sat idle for long at the end (at most {max(idle):.1f} units); the "
            f"{makespan - best:.1f} units over the best went into starting each chunk "
            "(sending it to a worker and its result back), which a busy machine makes slower.")
    if max(idle) > 2.5 or best > ideal:
        return "ok", text + (
            f"As fast as whole items allow: a worker idles at the end for {max(idle):.1f} "
            f"units, because {prm['items']} items do not divide among {prm['processes']} "
            f"workers -- no chunksize would finish sooner.")
    return "ok", text + "Every worker was busy until the end."


def _makespan(items, processes, chunksize):
    """Units a map takes on paper: chunks of `chunksize` items (2 units each), each to the
    worker that is free first, as Pool hands them out."""
    free = [0] * processes
    for first in range(0, items, chunksize):
        i = free.index(min(free))
        free[i] += 2 * min(chunksize, items - first)
    return max(free)
