"""Exercises of notebook 01 (processes, queues and pools): Pool.map's chunks, measured."""
from collections import Counter

from .base import Exercise, Verdict, as_number, fix_scenario, judged, measured, run


@measured
def _chunksize_3():
    return run("pool-chunksize", chunksize=3)


@judged
def _judge_predict(answer):
    units = as_number(answer, "a number of time units")
    result = _chunksize_3()
    took = result.details["makespan_units"]
    why = (f"You said {units:g} units; the run took {took:.1f} (each item takes 2 units, and the "
           f"measurement adds a little for starting each chunk). {result.explanation}\n\n"
           f"On paper: chunks [0,1,2] [3,4,5] [6,7,8] [9] take 6, 6, 6 and 2 units. One worker "
           f"runs two chunks of 6 (12 units), the other 6 + 2 = 8 and then idles: map ends with "
           f"the slower worker, at 12.")
    # Right on paper (12) or within a unit of what this run measured: a busy machine starts each
    # chunk a little late, and the answer worked out on paper must not be marked wrong for it.
    return Verdict(abs(units - 12) <= 1 or abs(units - took) <= 1, why)


@measured
def _default_chunks():
    result = run("pool-chunksize")
    starts = [e for e in result.trace.of_kind("pool.task") if e.args.get("phase") == "start"]
    return result, Counter(e.pid for e in starts)


@judged
def _judge_picture(answer):
    count = as_number(answer, "a number of boxes")
    result, per_worker = _default_chunks()
    most = max(per_worker.values())
    names = {p.pid: p.name for p in result.trace.processes()}
    lanes = ", ".join(f"{names.get(pid, pid)}: {n}" for pid, n in sorted(per_worker.items()))
    why = (f"You counted {count:g}; the busier worker ran {most} chunks ({lanes}). With "
           f"chunksize=None, map chose 2 items per chunk: 5 chunks for 2 workers. They take two "
           f"each, and the fifth goes to whichever worker is free first, while the other has "
           f"nothing left: that is the gap at the end of one lane.")
    return Verdict(count == most, why)


EXERCISES = [
    Exercise(
        "01.predict-chunksize", "predict",
        "10 items of 2 units each on 2 workers, map with chunksize=3: how many units does it "
        "take from the first chunk's start to the last chunk's end? Work it out on paper first.",
        "a number of units, e.g. 10", _judge_predict),
    fix_scenario(
        "01.fix-chunksize",
        "pool-chunksize with the default chunksize takes 12 units for work that 2 workers could "
        "do in 10. Give a chunksize that brings it down to 10 (the verdict is OK).",
        "pool-chunksize", keep={"items": 10, "processes": 2}),
    Exercise(
        "01.picture-chunks", "picture",
        "In the first pool-chunksize timeline (chunksize=None), how many chunks (white task "
        "boxes) did the busier worker run?",
        "a number of boxes, e.g. 4", _judge_picture),
]
