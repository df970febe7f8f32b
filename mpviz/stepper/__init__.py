"""mpviz.stepper: be the scheduler -- step real processes by hand, one operation at a time.

    import mpviz
    s = mpviz.step(my_module.main)               # or mpviz.scenarios.step("fork-held-lock")
    s.choices()        # [<0 main/library-worker: acquire lock L>, <1 main/main: start process child>]
    s.step(1)          # let that thread do its next operation (by index, label or "who")
    s.outcome          # None while it runs; "deadlock", "ok", "error", "stopped" (closed early),
                       # or a puzzle's own verdict
    s.close()          # ends every process of the run (also: `with mpviz.step(...) as s:`)

How it works, in three modules:

    gate.py      the stepped process's side: a thread about to do something interesting
                 (acquire, release, put, get, a feeder's write, start, join, Event wait/set/clear,
                 mapping the shared memory of a tensor it received) asks the controller over
                 a Unix socket and waits for "go"
    control.py   the controller (``Stepper``): runs the program in a fresh process group,
                 collects the waiting threads as choices, wakes one per step, tells a thread
                 blocked in the OS from one that is paused, and judges the outcome
    explore.py   many schedules: random ones, or all of them for a small program

This package's __init__ stays light. Nothing it steps imports it: gate.py fills the slot that
they call (mpviz/_stops.py), and autostart's ON_BOOT steps a spawned child.
"""

__all__ = ["Stepper", "Choice", "step", "point", "name", "random_schedules", "all_schedules",
           "ChoiceError"]


def __getattr__(attr):
    import importlib
    if attr in ("Stepper", "Choice", "step", "ChoiceError", "StepState"):
        return getattr(importlib.import_module(".control", __name__), attr)
    if attr in ("point", "name"):
        return getattr(importlib.import_module(".gate", __name__), attr)
    if attr in ("random_schedules", "all_schedules"):
        return getattr(importlib.import_module(".explore", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
