"""Exercises of notebook 12 (torch.distributed on one machine): each runs real ranks.

    12.predict-ring-bytes   4 ranks all-reduce 1 MiB: how many KiB does each rank read from its
                            neighbour? A traced run of mpviz.distributed, its dist.ring_step bytes
    12.picture-ring         the ring picture: a chunk's value after step 0, replayed from a real
                            3-rank run's events (viz.ring_steps)
    12.fix-set-epoch        DistributedSampler reads the same order every epoch: which options fix
                            it? The real sampler, per rank and epoch
"""
import shutil

from .. import viz
from ..examples import distributed
from .base import BadAnswer, Exercise, Verdict, as_kwargs, as_number, describe, judged, measured

RING_RANKS, RING_COUNT = 4, 1 << 18          # 4 ranks, 2**18 float32 = 1 MiB


def _traced(*args):
    run = distributed.trace_case("ring", *args)
    shutil.rmtree(run.directory, ignore_errors=True)      # the trace is read: keep nothing
    if run.status != 0:
        raise RuntimeError(f"the ring run failed (exit {run.status}): {run.messages[-1500:]}")
    return run.trace


@measured
def _bytes_read():
    """{rank: bytes it read from its previous rank} in a real 4-rank all_reduce of 1 MiB."""
    trace = _traced(RING_RANKS, RING_COUNT)
    rank_of = {e.pid: e.args["rank"] for e in trace.of_kind("dist.collective")}
    read = {}
    for e in trace.of_kind("dist.ring_step"):
        read[rank_of[e.pid]] = read.get(rank_of[e.pid], 0) + e.args["nbytes"]
    return read


@judged
def _judge_bytes(answer):
    kib = as_number(answer, "a number of KiB")
    read = _bytes_read()
    steps = 2 * (RING_RANKS - 1)
    each = sorted(set(read.values()))
    measured_kib = each[0] / 1024
    why = (f"You said {kib:g} KiB; in the run just now each of the {RING_RANKS} ranks read "
           f"{', '.join(f'{b / 1024:g}' for b in each)} KiB from its previous rank: "
           f"{steps} steps (2(W-1)), each one chunk of 1 MiB / {RING_RANKS} = "
           f"{RING_COUNT * 4 // RING_RANKS // 1024} KiB. That is 2(W-1)/W of the tensor, "
           f"{2 * (RING_RANKS - 1)}/{RING_RANKS} here, and never more than twice the tensor "
           f"whatever W is: why rings scale.")
    return Verdict(len(each) == 1 and abs(kib - measured_kib) <= 0.005 * measured_kib, why)


@measured
def _three_ranks():
    """The ring of a real 3-rank all_reduce of ring_input, replayed: [Step]."""
    return viz.ring_steps(_traced(3), distributed.ring_input)


@judged
def _judge_picture(answer):
    value = as_number(answer, "a number")
    steps = _three_ranks()
    after0 = next(s for s in steps if s.step == 0)
    held = float(after0.values[0][1][0])
    [move] = [m for m in after0.moves if m.dst == 0]
    why = (f"You said {value:g}. After step 0 rank 0's chunk b is {held:g}: rank 0 started with "
           f"b0 = 2 and at step 0 read chunk {'abc'[move.chunk]} of rank {move.src} (its previous "
           f"rank round the ring), b{move.src} = 200, and added it. Only at step 1 does the third "
           f"part, b1 = 20, reach chunk b, and then on rank 1, which owns b after the "
           f"reduce-scatter: 222.")
    return Verdict(value == held, why)


_SAMPLER_OPTIONS = {"set_epoch": bool, "shuffle": bool, "seed": int}
N, WORLD, EPOCHS = 8, 2, 3


def _orders_of(answer):
    options = as_kwargs(answer, "the loop's options: set_epoch, shuffle (True/False), seed",
                        "{'seed': 1}")
    for key, value in options.items():
        kind = _SAMPLER_OPTIONS.get(key)
        if kind is None:
            raise BadAnswer(f"{key!r} is not an option here; the options are "
                            f"{', '.join(_SAMPLER_OPTIONS)}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadAnswer(f"{key} is a {kind.__name__}, not {value!r}")
    params = {"set_epoch": False, **options}
    return params, distributed.epoch_orders(N, WORLD, EPOCHS, **params)


@judged
def _judge_set_epoch(answer):
    params, orders = _orders_of(answer)
    firsts = [tuple(epoch[0]) for epoch in orders]
    repeats = len(set(firsts)) < EPOCHS
    covered = all(sorted(i for part in epoch for i in part) == list(range(N))
                  for epoch in orders)
    shown = "; ".join(f"epoch {e}: {orders[e][0]}" for e in range(EPOCHS))
    if repeats:
        why = (f"With {describe(params)} rank 0 read, {shown}: an epoch repeats. "
               f"DistributedSampler draws its permutation from seed + epoch, and its epoch "
               f"stays where it was unless you call sampler.set_epoch(epoch) at the start of "
               f"each epoch (the same epoch on every rank). A new seed only moves the repeated "
               f"order elsewhere; shuffle=False never shuffles.")
    elif not covered:
        why = f"With {describe(params)} the ranks' parts do not cover the data set: {orders}."
    else:
        why = (f"With {describe(params)} rank 0 read, {shown}: a new order each epoch, the "
               f"same on every rank (both draw from seed + epoch), so the ranks' parts still "
               f"cover the {N} samples without overlap.")
    return Verdict(not repeats and covered, why)


EXERCISES = [
    Exercise(
        "12.predict-ring-bytes", "predict",
        "4 ranks all-reduce a 1 MiB float32 tensor with mpviz.distributed's ring. In all the "
        "steps together, how many KiB does each rank read from its previous rank's buffer?",
        "a number of KiB, e.g. 512", _judge_bytes),
    Exercise(
        "12.picture-ring", "picture",
        "In the ring picture (3 ranks; rank r starts with (1, 2, 3) * 10**r), what value does "
        "rank 0 hold in chunk b after step 0?",
        "a number, e.g. 20", _judge_picture),
    Exercise(
        "12.fix-set-epoch", "fix",
        "Each rank loops `for epoch in range(3): for i in sampler: ...` over a "
        "DistributedSampler(range(8), num_replicas=2, rank=rank), and reads the same order "
        "every epoch. Give the loop's options under which each epoch reads a new order.",
        "a dict of options: set_epoch, shuffle (True/False), seed (an int)", _judge_set_epoch),
]
