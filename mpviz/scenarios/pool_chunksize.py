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
    if p["items"] * 2 * p["unit"] / p["processes"] > 15:
        raise ValueError(f"the whole map must take at most 15 s (items x 2 units / processes), "
                         f"got {p['items'] * 2 * p['unit'] / p['processes']:.1f} s: fewer items, "
                         f"a smaller unit or more processes")


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
    details.update(makespan_units=round(makespan, 2), ideal_units=ideal, chunks=len(starts),
                   chunk_sizes=chunks, idle_units=round(max(idle), 2))
    text = (f"map cut {prm['items']} items into {len(starts)} chunk(s) of {chunks} item(s) for "
            f"{prm['processes']} workers; from the first chunk's start to the last one's end "
            f"took {makespan:.1f} units (each item takes 2; perfect balance would be "
            f"{ideal:g}). ")
    # Idleness is judged by the gap itself, not by the total: on a busy machine every chunk
    # starts a little late and the total grows with no worker idle. With one item per chunk a
    # worker can wait at most for one item (2 units) at the end; a gap longer than that is a
    # chunk that no other worker could take.
    if max(idle) > 2.5:
        return "warning", text + (
            f"In the last round a worker had no chunk left and sat idle for {max(idle):.1f} "
            "units (the gap at the end of its lane) while the others finished. Fix: pick a "
            "chunksize that divides the chunks evenly among the workers (chunksize=1 or 5 "
            "here).")
    if makespan > ideal + 1:
        return "ok", text + (
            f"No worker sat idle for long at the end (at most {max(idle):.1f} units); the "
            f"{makespan - ideal:.1f} units over perfect balance went into starting each chunk "
            "(sending it to a worker and its result back), which a busy machine makes slower.")
    return "ok", text + "Every worker was busy until the end."
