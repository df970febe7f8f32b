"""What a scenario declares and what running one gives back: ``Param``, ``ScenarioInfo``, ``Result``.

A scenario is one module in this package (see ``__init__.py`` for the list). It declares::

    SUMMARY = "one line"                          shown by catalog() and `python -m mpviz list`
    PARAMS = {"strategy": Param("file_descriptor", ["file_descriptor", "file_system"], "...")}
    def drive(p, details): ...                    the case itself; runs in a fresh driver process
                                                  (see _driver.py), recorded; writes what it saw
                                                  into `details` (a dict saved as JSON)
    def verdict(trace, details): -> (outcome, explanation)
                                                  runs in the caller afterwards: reads the outcome
                                                  off what was recorded and observed

and optionally ``STALL_SECONDS`` (how long every thread must wait for what never comes before the run is
stuck: the hang watchdog's ``--hang-after``),
``TIME_LIMIT`` (seconds) and ``THREADING_LOCKS`` (record ``threading.Lock`` too).
"""
import math
from typing import Any, NamedTuple, Optional

OUTCOMES = ("ok", "deadlock", "error", "warning", "leak")


class Param(NamedTuple):
    """One parameter of a scenario: its default, the values it may take (None: any of the
    default's type), and what it changes."""
    default: Any
    choices: Optional[list]
    help: str


class ScenarioInfo(NamedTuple):
    name: str
    summary: str
    params: dict          # name -> Param


class Result(NamedTuple):
    """What one run of a scenario came to.

    ``outcome`` is one of ok / deadlock / error / warning / leak: the lesson's verdict, read off
    the trace. ``problem`` is None unless *mpviz itself* failed to run the case (then the
    outcome means nothing; the CLI exits non-zero). ``stacks`` maps pid -> Python stacks captured
    by the watchdog (deadlocks only); ``details`` holds what the case measured (bytes copied,
    fds at peak, segments left behind, ...) and what the cleanup had to do.
    """
    name: str
    params: dict
    trace: Any
    outcome: str
    explanation: str
    duration_s: float
    stacks: dict = {}
    details: dict = {}
    output: str = ""
    problem: Optional[str] = None
    stopped: bool = False

    def __repr__(self):
        return (f"<Result {self.name}: {self.outcome} in {self.duration_s:.1f} s"
                f"{', stopped' if self.stopped else ''}{', PROBLEM' if self.problem else ''}>")


def coerce(name, param, value, scenario):
    """`value` as the type of `param`'s default (strings from a command line are converted);
    ValueError naming the valid values otherwise."""
    default = param.default
    if isinstance(value, str) and not isinstance(default, str):
        text = value.strip().lower()
        if param.choices is not None and None in param.choices and text in ("none", "auto"):
            value = None
        elif isinstance(default, bool):
            if text in ("1", "true", "yes", "on"):
                value = True
            elif text in ("0", "false", "no", "off"):
                value = False
        else:
            kind = type(default) if default is not None else int
            try:
                value = kind(text)
            except ValueError:
                if kind is int:              # "1e3", "1_000.0": a whole number written as a float
                    try:
                        number = float(text)
                    except ValueError:
                        number = None
                    if number is not None and number.is_integer():
                        value = int(number)
                    elif number is not None and not math.isfinite(number):
                        value = number       # "inf", "nan": refused below, as from Python
                    elif number is not None:
                        raise ValueError(
                            f"scenario {scenario!r}: {name} must be a whole number (a count), "
                            f"not {value!r}. Fix: --{name.replace('_', '-')} "
                            f"{max(1, round(number))}") from None
    if param.choices is not None:
        if value not in param.choices:
            raise ValueError(f"scenario {scenario!r}: {name}={value!r} is not allowed; "
                             f"choose one of {param.choices}")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"scenario {scenario!r}: {name} must be true or false, not {value!r}")
    elif isinstance(default, (int, float)) and not isinstance(value, bool):
        if not isinstance(value, (int, float)):
            raise ValueError(f"scenario {scenario!r}: {name} must be a number, not {value!r}. "
                             f"Fix: --{name.replace('_', '-')} {default!r} (its default)")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"scenario {scenario!r}: {name} must be a finite number, not "
                             f"{value!r}. Fix: --{name.replace('_', '-')} {default!r} (its "
                             f"default)")
        if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"scenario {scenario!r}: {name} must be a whole number (a count), "
                             f"not {value!r}. Fix: {name}={max(1, round(value))}")
        value = type(default)(value)
    return value
