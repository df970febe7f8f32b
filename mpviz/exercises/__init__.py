"""Exercises a learner can check: ``check(exercise_id, answer)`` says right or not, and why.

Each workshop notebook has a few exercises of three kinds: *predict, then run* (say what will
happen before you look), *fix a broken program* (give the change that makes it work) and *read a
picture* (answer from a timeline, memory map or chart); notebook 09 adds *play* (step real
processes to a puzzle's goal, then hand ``check`` the stepper: it reads how the run ended). A
notebook cell holds the call with a placeholder, ``...``, that the learner replaces::

    from mpviz.exercises import check
    check("01.predict-chunksize", ...)      # prints the question: not answered yet
    check("01.predict-chunksize", 12)       # runs the real case and says right / not quite, why

How an answer is judged::

    check(id, answer)
      ├─ answer is ...  → "Not answered yet", the question, and the form of the answer
      └─ EXERCISES[id].judge(answer)
           runs the real thing: a scenario (mpviz.scenarios.run), a spawn Pool, a child process,
           in this process or in the scenario's own driver; reads what really happened from its
           details or its trace; compares it with the answer → Verdict(right, why)

Nothing is hard-coded: the expected answer is measured each time it is needed (once per kernel
for the measurements that do not depend on the answer; ``forget()`` drops them). The exercises
live in one module per notebook (``nb01.py`` ...), next to the lesson they belong to; the
solutions, with the answers to each notebook's closing questions, are in ``notebooks/solutions/``.
"""
import importlib
import textwrap

from .base import KINDS, Exercise, Verdict, forget, shown

__all__ = ["check", "judge", "exercises", "Exercise", "Verdict", "KINDS", "forget"]

# notebook number -> the module that holds its exercises
NOTEBOOKS = {
    "00": "nb00", "01": "nb01", "02": "nb02", "03": "nb03", "04": "nb04",
    "05": "nb05", "06": "nb06", "07": "nb07", "08": "nb08", "09": "nb09", "11": "nb11",
    "12": "nb12",
    "13": "nb13",
    "14": "nb14",
}


def exercises(notebook=None):
    """Every exercise (or those of `notebook`, e.g. "04"), as ``{id: Exercise}`` in order."""
    numbers = NOTEBOOKS if notebook is None else [_notebook_number(notebook)]
    out = {}
    for number in numbers:
        module = importlib.import_module(f"{__name__}.{NOTEBOOKS[number]}")
        out.update((ex.id, ex) for ex in module.EXERCISES)
    return out


def _notebook_number(notebook):
    number = str(notebook).zfill(2)
    if number not in NOTEBOOKS:
        raise ValueError(f"no exercises for notebook {notebook!r}; the notebooks with exercises "
                         f"are: {', '.join(NOTEBOOKS)}")
    return number


def _find(exercise_id):
    if not isinstance(exercise_id, str):
        raise TypeError(f"an exercise id is a str such as '01.predict-chunksize', "
                        f"not {type(exercise_id).__name__}")
    number = exercise_id.split(".", 1)[0]
    found = exercises(number) if number in NOTEBOOKS else {}
    if exercise_id not in found:
        known = ", ".join(found) if found else ", ".join(exercises())
        raise ValueError(f"no exercise {exercise_id!r}. Fix: copy the id from the notebook's "
                         f"cell; the exercises are: {known}")
    return found[exercise_id]


def judge(exercise_id, answer):
    """The verdict on `answer` without printing: ``Verdict(right, why)``; right is None while
    the answer is still the placeholder ``...``."""
    exercise = _find(exercise_id)
    if _unanswered(answer):
        return Verdict(None, f"{exercise.question} Replace ... with {exercise.answer_form}.")
    try:
        verdict = exercise.judge(answer)
    except Exception as exc:      # an answer no judge foresaw: a verdict, never a traceback
        return Verdict(False, f"mpviz could not judge your answer {shown(answer)}: "
                              f"{type(exc).__name__}: {str(exc)[:300]}. Give "
                              f"{exercise.answer_form}. (If that is what you gave, this is a "
                              f"bug in mpviz: please report it.)")
    return Verdict(None if verdict.right is None else bool(verdict.right), verdict.why)


def _unanswered(answer, _seen=None):
    """True while `answer` still holds the placeholder ``...``, alone or inside a pair or dict
    (``(..., ...)``, ``{"reuse": ...}``); a list that holds itself is looked at once."""
    if answer is Ellipsis:
        return True
    seen = set() if _seen is None else _seen
    if id(answer) in seen:
        return False
    if isinstance(answer, (tuple, list)):
        seen.add(id(answer))
        return any(_unanswered(a, seen) for a in answer)
    if isinstance(answer, dict):
        seen.add(id(answer))
        return any(_unanswered(a, seen) for a in answer.values())
    return False


def check(exercise_id, answer=Ellipsis, width=100):
    """Judge `answer` to exercise `exercise_id` and print "Right." or "Not quite.", and why.

    The placeholder ``...`` (also inside a pair or a dict) prints "Not answered yet" and the
    question, and runs nothing.
    Returns nothing (the printout is the answer); use ``judge`` to get the verdict as a value.
    """
    verdict = judge(exercise_id, answer)
    head = {None: "Not answered yet.", True: "Right.", False: "Not quite."}[verdict.right]
    print(f"{exercise_id}: {head}")
    for paragraph in verdict.why.split("\n\n"):
        print(textwrap.fill(paragraph, width))
