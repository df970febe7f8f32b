"""Exercises of notebook 03 (sharing strategies)."""
from .base import Exercise, Verdict, as_number, fix_scenario, judged, measured, predict_outcome, run


@measured
def _leak():
    return run("fs-leak", manager=False)


@judged
def _judge_picture(answer):
    said = as_number(answer, "a number of segments")
    result = _leak()
    left = result.details["left_after_watch"]
    return Verdict(said == len(left), (
        f"You counted {said:g}; {len(left)} segment(s) were still in /dev/shm "
        f"{result.params['watch_s']:g} s after the victim was killed with SIGKILL, mapped by "
        f"no live process: purple. A killed process runs no cleanup code, and with the manager "
        f"off nobody else removes its files. (The scenario removed them by hand afterwards.)"))


EXERCISES = [
    predict_outcome(
        "03.predict-producer-exits-fs",
        "producer-exits with strategy='file_system' (the producer still exits early): 'ok' or "
        "'error'?",
        "producer-exits", strategy="file_system"),
    fix_scenario(
        "03.fix-too-many-fds",
        "too-many-fds: a consumer keeps 100 tensors under a limit of 48 open files and fails. "
        "Keep count=100 and limit=48; make it work.",
        "too-many-fds", keep={"count": 100, "limit": 48}),
    Exercise(
        "03.picture-leak", "picture",
        "In the memory map of fs-leak with manager=False, how many purple (leaked) segments "
        "are there?",
        "a number of segments", _judge_picture),
]
