"""Exercises of notebook 08 (Hogwild): does the parent's model learn? Measured in real runs."""
from collections import Counter

from .base import (Exercise, Verdict, as_bool, as_number, fix_scenario, judged, measured,
                   run)


@measured
def _spawn_unshared():
    return run("hogwild", share=False, start_method="spawn")


@judged
def _judge_predict(answer):
    guess = as_bool(answer)
    result = _spawn_unshared()
    learned = bool(result.details["parent_params_changed"]) and result.outcome == "ok"
    why = (f"You said {guess}; under spawn with share=False the parent's parameters "
           f"{'changed' if result.details['parent_params_changed'] else 'did not change'} just "
           f"now. {result.explanation}\n\nUnder spawn nothing is copied by fork: the model "
           f"reaches each child by pickling, and pickling a tensor for another process moves "
           f"its storage into shared memory first (as torch does). The trap needs fork.")
    return Verdict(guess == learned, why)


@measured
def _epoch_ticks():
    """Run notebook 08's live program (2 spawn workers of nw.hogwild_worker, 2 epochs each, on a
    shared model) under a recording: the "epoch done" marks per worker."""
    from .. import manual_seed
    from .. import multiprocessing as mp
    from .. import trace as mt
    from ..examples import MyModel
    from ..examples import notebook_workers_2 as nw
    manual_seed(0)
    model = MyModel()
    model.share_memory()
    ctx = mp.get_context("spawn")
    with mt.record() as rec:
        workers = [ctx.Process(target=nw.hogwild_worker, args=(model, rank, 2),
                               name=f"hogwild-{rank}") for rank in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    names = {w.pid: w.name for w in workers}
    ticks = Counter(names.get(e.pid, e.pid) for e in rec.of_kind("mark")
                    if e.args.get("name") == "epoch done")
    return ticks


@judged
def _judge_picture(answer):
    said = as_number(answer, "a number of ticks")
    ticks = _epoch_ticks()
    total = sum(ticks.values())
    lanes = ", ".join(f"{name}: {n}" for name, n in sorted(ticks.items()))
    return Verdict(said == total, (
        f"You counted {said:g}; the same program, run again just now, marked {total} epochs "
        f"({lanes}). Each worker makes one tick per pass over its data, and each made 2 passes: "
        f"both workers trained at the same time, on the same shared weights."))


EXERCISES = [
    Exercise(
        "08.predict-spawn", "predict",
        "hogwild with start_method='spawn' and share=False (no model.share_memory()): does the "
        "parent's model learn?",
        "True (it learns) or False (it does not)", _judge_predict),
    fix_scenario(
        "08.fix-fork",
        "hogwild under fork with share=False: the workers train and the parent learns nothing. "
        "Keep fork and make the parent learn.",
        "hogwild", keep={"start_method": "fork"}, start={"share": False}),
    Exercise(
        "08.picture-epochs", "picture",
        "On the timeline of the two Hogwild workers trained in the notebook, how many teal ticks "
        "(an epoch done) are there, on both lanes together?",
        "a number of ticks", _judge_picture),
]
