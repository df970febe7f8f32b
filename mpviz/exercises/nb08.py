"""Exercises of notebook 08 (Hogwild): does the parent's model learn? Measured in real runs."""
from .base import Exercise, Verdict, as_bool, as_word, fix_scenario, judged, measured, run


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
def _fork_unshared():
    return run("hogwild", share=False)


@judged
def _judge_picture(answer):
    said = as_word(answer, ("higher", "same", "lower"))
    result = _fork_unshared()
    before, after = result.details["accuracy_before"], result.details["accuracy_after"]
    real = "same" if after == before else ("higher" if after > before else "lower")
    return Verdict(said == real, (
        f"You said {said!r}; without share_memory() under fork the parent's accuracy went from "
        f"{before:.1%} to {after:.1%}: {real}. "
        + ("Each forked worker trained its own copy-on-write copy of the weights, which died "
           "with it; the parent's weights never changed." if real == "same" else
           "(The lesson expects 'same': see the scenario's verdict, "
           f"{result.outcome.upper()}: {result.explanation})")))


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
        "hogwild", keep={"start_method": "fork"}),
    Exercise(
        "08.picture-accuracy", "picture",
        "In the bar chart of the trap (fork, no share_memory()), is the parent's accuracy after "
        "training higher than before, the same, or lower?",
        "'higher', 'same' or 'lower'", _judge_picture),
]
