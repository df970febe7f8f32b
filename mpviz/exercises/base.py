"""The pieces every notebook's exercises are made of.

An ``Exercise`` is an id, a kind (predict / fix / picture), the question, the form its answer
takes, and a ``judge(answer) -> Verdict``. Most judges are built by the three helpers here:

    predict_outcome(id, question, scenario, **params)   run the scenario; was the outcome guessed?
    fix_scenario(id, question, scenario, keep=...)       run the scenario with the learner's
                                                         parameters; is it 'ok', with `keep` kept?
    measured(fn)                                         run fn once per kernel (its answer does not
                                                         depend on the learner's), forget() resets

Answers in the wrong form (a word where a number is asked) are judged "not quite", with the
form that was expected: a learner's typo is not a crash.
"""
import functools
import math
import numbers
from typing import Any, Callable, NamedTuple, Optional

from .. import scenarios

KINDS = ("predict", "fix", "picture")


class Verdict(NamedTuple):
    """What ``judge`` says about an answer. right: True, False, or None (not answered yet)."""
    right: Optional[bool]
    why: str


class Exercise(NamedTuple):
    """One checkable exercise of a notebook."""
    id: str                      # "NN.kind-topic", NN = the notebook's number
    kind: str                    # one of KINDS
    question: str
    answer_form: str             # what replaces the placeholder, e.g. "a number of units"
    judge: Callable[[Any], Verdict]


class BadAnswer(ValueError):
    """Raised when an answer is not in the form the exercise asks for (judged "not quite")."""


_measured = []


def measured(fn):
    """Cache `fn()` for this process: a measurement that does not depend on the answer, so a
    learner trying several answers does not wait for the same run again."""
    cached = functools.lru_cache(maxsize=None)(fn)
    _measured.append(cached)
    return cached


def forget():
    """Drop every cached measurement: the next check runs the real thing again."""
    for cached in _measured:
        cached.cache_clear()
    _run_cached.cache_clear()


@functools.lru_cache(maxsize=None)
def _run_cached(name, frozen):
    return scenarios.run(name, **dict(frozen))


def run(name, **params):
    """``scenarios.run(name, **params)``, run once per process for the same parameters."""
    return _run_cached(name, tuple(sorted(params.items())))


def describe(params):
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "the defaults"


def judged(judge):
    """Wrap `judge` so that a BadAnswer it raises becomes a "not quite" naming the right form."""
    @functools.wraps(judge)
    def wrapper(answer):
        try:
            return judge(answer)
        except BadAnswer as exc:
            return Verdict(False, str(exc))
    return wrapper


# --- reading an answer -------------------------------------------------------------------------

def as_number(answer, what="a number"):
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) or math.isnan(answer):
        raise BadAnswer(f"your answer {answer!r} is not {what}: write it as a plain number, "
                        f"e.g. 12, without quotes")
    return answer


def as_number_pair(answer, shape, what):
    """Two numbers, as a tuple or list; `shape` names them for the error ("(a, b), e.g. (0, 1)")."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise BadAnswer(f"the answer is a pair: {shape}, not {answer!r}")
    return tuple(as_number(a, what) for a in answer)


def as_word(answer, choices):
    if not isinstance(answer, str) or answer.strip().lower() not in choices:
        raise BadAnswer(f"your answer {answer!r} is not one of {', '.join(map(repr, choices))}: "
                        f"write one of them as a string, with quotes")
    return answer.strip().lower()


def as_bool(answer):
    if not isinstance(answer, bool):
        raise BadAnswer(f"your answer {answer!r} is not True or False: write one of them, "
                        f"without quotes")
    return answer


def as_params(answer, scenario, keep=None):
    """The learner's parameters for `scenario`, a dict; `keep` are those the fix must not change
    (added when left out)."""
    if not isinstance(answer, dict) or not all(isinstance(k, str) for k in answer):
        raise BadAnswer(f"a fix is a dict of {scenario}'s parameters, e.g. "
                        f"{{'strategy': 'file_system'}}, not {answer!r}")
    keep = keep or {}
    changed = {k: v for k, v in answer.items() if k in keep and v != keep[k]}
    if changed:
        raise BadAnswer(f"the exercise keeps {describe(keep)}; your fix changes "
                        f"{describe(changed)}. Find another way.")
    params = {**keep, **answer}
    try:
        scenarios.resolve(scenario, params)
    except ValueError as exc:
        raise BadAnswer(f"{scenario} cannot run with {describe(params)}: {exc}") from None
    return params


# --- the common kinds --------------------------------------------------------------------------

def predict_outcome(exercise_id, question, scenario, **params):
    """An exercise: predict the outcome of `scenario` run with `params`."""
    @judged
    def judge(answer):
        guess = as_word(answer, scenarios.OUTCOMES)
        result = run(scenario, **params)
        head = (f"You predicted {guess.upper()}; {scenario} with {describe(params)} came out "
                f"{result.outcome.upper()} just now. Why:")
        return Verdict(guess == result.outcome, head + "\n\n" + result.explanation)
    return Exercise(exercise_id, "predict", question,
                    f"the outcome as a string: {', '.join(map(repr, scenarios.OUTCOMES))}", judge)


def fix_scenario(exercise_id, question, scenario, keep=None, extra=None, at_most=None):
    """An exercise: give `scenario` parameters (keeping `keep`; changing `at_most` of them, if
    given) under which it comes out 'ok'. `extra(result)`, if given, returns a reason the run
    still does not count, or None."""
    @judged
    def judge(answer):
        params = as_params(answer, scenario, keep)
        if at_most is not None and len(answer) > at_most:
            raise BadAnswer(f"the exercise asks for at most {at_most} parameter(s); your fix "
                            f"sets {len(answer)}: {describe(answer)}")
        result = scenarios.run(scenario, **params)
        reason = extra(result) if extra is not None and result.outcome == "ok" else None
        if result.outcome == "ok" and reason is None:
            return Verdict(True, f"{scenario} with {describe(params)} came out OK.\n\n"
                                 f"{result.explanation}")
        said = reason or f"it came out {result.outcome.upper()}"
        return Verdict(False, f"{scenario} with {describe(params)} is not fixed yet: {said}.\n\n"
                              f"{result.explanation}")
    return Exercise(exercise_id, "fix", question,
                    f"a dict of {scenario}'s parameters, e.g. {{'name': value}}", judge)
