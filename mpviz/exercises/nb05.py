"""Exercises of notebook 05 (buffer reuse): copies counted in real runs."""
from collections import Counter

from .base import (Exercise, Verdict, as_number, as_number_pair, fix_scenario, judged, measured,
                   run)

_PREDICT = dict(producers=2, batches=10, pool=3)


@measured
def _copies_both_ways():
    return {reuse: run("buffer-reuse", reuse=reuse, **_PREDICT).details["copies"]
            for reuse in (True, False)}


@judged
def _judge_predict(answer):
    with_reuse, without = as_number_pair(
        answer, "(copies with reuse=True, copies with reuse=False), e.g. (1, 2)",
        "a number of copies")
    real = _copies_both_ways()
    why = (f"You said {with_reuse:g} and {without:g}; the runs made {real[True]} copies with "
           f"reuse=True and {real[False]} with reuse=False. With reuse, each producer copies "
           f"each of its {_PREDICT['pool']} buffers once, then only refills them in place "
           f"({_PREDICT['producers']} x {_PREDICT['pool']}); without, every batch is a new "
           f"tensor that put must move into shared memory ({_PREDICT['producers']} x "
           f"{_PREDICT['batches']}).")
    return Verdict((with_reuse, without) == (real[True], real[False]), why)


def _all_batches_few_copies(result):
    d = result.details
    if d["batches_sent"] != 24:
        return f"only {d['batches_sent']} of the 24 batches were sent"
    if d["copies"] > 6:
        return f"it made {d['copies']} copies, more than 6"
    return None


@measured
def _copies_per_producer():
    result = run("buffer-reuse", reuse=True)
    names = {p.pid: p.name for p in result.trace.processes()}
    per = Counter(names.get(e.pid, e.pid) for e in result.trace.of_kind("copy"))
    return result, per


@judged
def _judge_picture(answer):
    count = as_number(answer, "a number of copies")
    result, per = _copies_per_producer()
    lanes = ", ".join(f"{name}: {n}" for name, n in sorted(per.items()))
    right = len(set(per.values())) == 1 and count == next(iter(per.values()))
    return Verdict(right, (
        f"You counted {count:g}; the run recorded these copies per lane: {lanes}. Each producer "
        f"copies each buffer of its pool (pool={result.params['pool']}) once, when it first puts "
        f"it; a buffer that comes back is already in shared memory, so the next put copies "
        f"nothing and only its handle travels (the green arrows, both ways)."))


EXERCISES = [
    Exercise(
        "05.predict-copies", "predict",
        "buffer-reuse with producers=2, batches=10 and pool=3: how many copies into shared "
        "memory with reuse=True, and how many with reuse=False?",
        "a pair of numbers, (with reuse, without reuse)", _judge_predict),
    fix_scenario(
        "05.fix-copies",
        "buffer-reuse with reuse=False: 3 producers send 8 batches each and copy 24 times. Make "
        "it send all 24 batches with at most 6 copies.",
        "buffer-reuse", keep={"producers": 3, "batches": 8}, start={"reuse": False},
        extra=_all_batches_few_copies),
    Exercise(
        "05.picture-red-boxes", "picture",
        "In the reuse=True timeline (3 producers, pool=2), how many copies does each "
        "producer's lane show? (Read the labels of the red boxes: copies close together are "
        "drawn as boxes that may overlap into what looks like one, under one label that gives "
        "their number.)",
        "a number of copies", _judge_picture),
]
