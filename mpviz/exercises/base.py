"""The pieces every notebook's exercises are made of.

An ``Exercise`` is an id, a kind (predict / fix / picture), the question, the form its answer
takes, and a ``judge(answer) -> Verdict``. Most judges are built by the three helpers here:

    predict_outcome(id, question, scenario, **params)   run the scenario; was the outcome guessed?
    fix_scenario(id, question, scenario, keep=...)       run the scenario with the learner's
                                                         parameters; is it 'ok', with `keep` kept?
    measured(fn)                                         run fn once per kernel (its answer does not
                                                         depend on the learner's), forget() resets

Answers in the wrong form (a word where a number is asked) are judged "not quite", with the
form that was expected: a learner's typo is not a crash. Odd answers too (a NumPy value, 10**400,
a list that holds itself, a 10 MB string): the verdict names them through ``shown(answer)``, a
short summary, never the whole thing, and never a traceback.
"""
import functools
import numbers
import reprlib
from typing import Any, Callable, NamedTuple, Optional

from .. import scenarios

KINDS = ("predict", "fix", "picture", "play")   # play: notebook 09's puzzles, stepped


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
    frozen = tuple(sorted(params.items()))
    try:
        hash(frozen)
    except TypeError:                  # a value that cannot be a cache key: run it each time
        return scenarios.run(name, **params)
    return _run_cached(name, frozen)


def describe(params):
    return ", ".join(f"{k}={shown(v)}" for k, v in params.items()) or "the defaults"


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6
_SHORT.maxlong = 40


def shown(answer):
    """`answer` as a verdict names it: its repr, cut short (a 10 MB string is named by its length
    and first characters; 10**400 by its digits' count), and something even if its repr fails."""
    try:
        if isinstance(answer, str) and len(answer) > 60:
            return f"a string of {len(answer):,} characters, {answer[:30]!r}..."
        if isinstance(answer, int) and not isinstance(answer, bool) and abs(answer) > 10**30:
            return f"a number of {len(str(abs(answer)))} digits"
        return _SHORT.repr(answer)
    except Exception as exc:                  # a repr that raises: name the type instead
        return f"a {type(answer).__name__} (its repr failed: {type(exc).__name__})"


def judged(judge):
    """Wrap `judge` so that a BadAnswer it raises becomes a "not quite" naming the right form."""
    @functools.wraps(judge)
    def wrapper(answer):
        try:
            return judge(answer)
        except BadAnswer as exc:
            return Verdict(False, str(exc))
    return wrapper


def finite_number(answer):
    """True for a plain real number (NumPy's too) that a float can hold: not a bool, NaN or inf,
    and not 10**400."""
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        return False
    try:
        value = float(answer)
    except (OverflowError, TypeError, ValueError):
        return False
    return value == value and value not in (float("inf"), float("-inf"))


# --- reading an answer -------------------------------------------------------------------------

def as_number(answer, what="a number"):
    if isinstance(answer, numbers.Integral) and not isinstance(answer, bool) \
            and not finite_number(answer):
        raise BadAnswer(f"your answer, {shown(answer)}, is far too large to be {what}: write "
                        f"the number you mean, e.g. 12")
    if not finite_number(answer):
        raise BadAnswer(f"your answer {shown(answer)} is not {what}: write it as a plain number, "
                        f"e.g. 12, without quotes")
    return answer


def as_number_pair(answer, shape, what):
    """Two numbers, as a tuple or list; `shape` names them for the error ("(a, b), e.g. (0, 1)")."""
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise BadAnswer(f"the answer is a pair: {shape}, not {shown(answer)}")
    return tuple(as_number(a, what) for a in answer)


def as_word(answer, choices):
    if not isinstance(answer, str) or answer.strip().lower() not in choices:
        raise BadAnswer(f"your answer {shown(answer)} is not one of "
                        f"{', '.join(map(repr, choices))}: write one of them as a string, with "
                        f"quotes")
    return answer.strip().lower()


def as_bool(answer):
    if not isinstance(answer, bool):
        raise BadAnswer(f"your answer {shown(answer)} is not True or False: write one of them, "
                        f"without quotes")
    return answer


def as_kwargs(answer, of, example):
    """A fix given as keyword arguments: a dict whose keys are strings. `of` says whose they
    are ("lock-order's parameters"), `example` shows one ("{'start_method': 'spawn'}")."""
    if not isinstance(answer, dict) or not all(isinstance(k, str) for k in answer):
        raise BadAnswer(f"a fix is a dict of {of}, e.g. {example}, not {shown(answer)}")
    return answer


def as_params(answer, scenario, keep=None, start=None):
    """The parameters `scenario` runs with: the broken program's `start` (which the fix may
    change), then the learner's `answer` (a dict), then `keep` (which the fix must not change)."""
    as_kwargs(answer, f"{scenario}'s parameters", "{'strategy': 'file_system'}")
    keep = keep or {}
    changed = {k: v for k, v in answer.items() if k in keep and not _same(v, keep[k])}
    if changed:
        raise BadAnswer(f"the exercise keeps {describe(keep)}; your fix changes "
                        f"{describe(changed)}. Find another way.")
    params = {**(start or {}), **answer, **keep}
    try:
        return scenarios.resolve(scenario, params)
    except (ValueError, TypeError, OverflowError) as exc:
        said = str(exc) if len(str(exc)) < 400 else str(exc)[:400] + "..."
        raise BadAnswer(f"{scenario} cannot run with {describe(params)}: {said}") from None


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:                # e.g. a NumPy array, whose == is not one truth value
        return False


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


def fix_scenario(exercise_id, question, scenario, keep=None, start=None, extra=None,
                 at_most=None):
    """An exercise: `scenario` run with `start` (the broken program: parameters the learner is
    meant to change, so that an empty answer is the broken program, not the scenario's defaults,
    which may already be the fix) is not 'ok'; give parameters (keeping `keep`; changing
    `at_most` of them, if given) under which it comes out 'ok'. `extra(result)`, if given,
    returns a reason the run still does not count, or None."""
    @judged
    def judge(answer):
        params = as_params(answer, scenario, keep, start)
        if at_most is not None and len(answer) > at_most:
            raise BadAnswer(f"the exercise asks for at most {at_most} parameter(s); your fix "
                            f"sets {len(answer)}: {describe(answer)}")
        given = {**(start or {}), **answer, **(keep or {})}
        asked = {k: v for k, v in params.items() if k in given}   # not every default
        result = run(scenario, **params)
        reason = extra(result) if extra is not None and result.outcome == "ok" else None
        if result.outcome == "ok" and reason is None:
            return Verdict(True, f"{scenario} with {describe(asked)} came out OK.\n\n"
                                 f"{result.explanation}")
        said = reason or f"it came out {result.outcome.upper()}"
        return Verdict(False, f"{scenario} with {describe(asked)} is not fixed yet: {said}.\n\n"
                              f"{result.explanation}")
    judge.broken = {**(start or {}), **(keep or {})}     # the program an empty answer runs
    return Exercise(exercise_id, "fix", question,
                    f"a dict of {scenario}'s parameters, e.g. {{'name': value}}", judge)
