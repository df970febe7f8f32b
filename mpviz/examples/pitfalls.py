"""Helpers for notebook 09 (more pitfalls): print a verdict, and check a learner's answer.

Every process of the notebook's lessons is started by a scenario (``mpviz.scenarios``), in a
driver process of its own, never by the notebook's kernel: a kernel has threads, and forking it
would be a pitfall of its own (see fork-held-lock). These helpers only run scenarios and talk::

    show(result)                               the verdict, wrapped to read
    check_prediction(name, guess, **params)    run it; was the guessed outcome right? why
    check_fix(name, **params)                  run it; is it fixed (outcome 'ok')? why
"""
import textwrap

from .. import scenarios

__all__ = ["show", "check_prediction", "check_fix"]


def _params(params):
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "the defaults"


def show(result, width=100):
    """Print a scenario's outcome and its explanation, wrapped."""
    print(f"{result.name} ({_params(result.params)}): {result.outcome.upper()}")
    for paragraph in result.explanation.split("\n\n"):
        print(textwrap.fill(paragraph, width))


def check_prediction(name, guess, **params):
    """Run scenario `name` with `params` and say whether `guess` (an outcome such as 'ok' or
    'error') was right, with the scenario's own explanation as the why. Returns the Result."""
    if not isinstance(guess, str) or guess.lower() not in scenarios.OUTCOMES:
        raise ValueError(f"a prediction is one of {', '.join(scenarios.OUTCOMES)}, not {guess!r}: "
                         f"write it as a string, e.g. check_prediction({name!r}, 'ok', ...)")
    result = scenarios.run(name, **params)
    right = result.outcome == guess.lower()
    print(("Right" if right else "Not quite") + f": you predicted {guess.upper()}, and "
          f"{name} with {_params(params)} came out {result.outcome.upper()}. Why:")
    print(textwrap.fill(result.explanation, 100))
    return result


def check_fix(name, **params):
    """Run scenario `name` with the learner's `params` and say whether that fixes it (outcome
    'ok'), with the scenario's explanation as the why. Returns the Result."""
    if not params:
        raise ValueError(f"give the parameters of your fix, e.g. check_fix({name!r}, workers=2); "
                         f"scenarios.catalog() lists each case's parameters")
    result = scenarios.run(name, **params)
    if result.outcome == "ok":
        print(f"Fixed: {name} with {_params(params)} is OK.")
    else:
        print(f"Not fixed yet: {name} with {_params(params)} is {result.outcome.upper()}.")
    print(textwrap.fill(result.explanation, 100))
    return result
