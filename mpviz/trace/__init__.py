"""Recording what every process does, and reading it back (issue #4).

    with mpviz.trace.record() as trace:      # this process + every process started inside
        ...                                   # (fork, spawn, forkserver, Pool workers)
    trace.events / processes() / flows() / segments() / locks() / to_chrome("t.json")

    trace = mpviz.trace.load("some/dir")      # afterwards, or from a killed run
    mpviz.trace.mark("epoch", n=3)            # your own event
    mpviz.trace.os_view(pid)                  # what the OS says: mapped /dev/shm names, fds

How it works, one module each: recorder.py (the per-process crash-safe log; writer.c is its
Writer in C, which native.py builds on first use), reader.py (reading logs back, incrementally),
hooks.py + messages.py + locks.py + waits.py (what is patched in the stdlib, and how children start
recording), autostart/ (a fresh interpreter joining a recording), trace.py (merging and the
views), chrome.py (Chrome/Perfetto JSON), osview.py (/proc cross-checks).
"""
from .events import Event, Flow, Hold, LockInfo, ProcessInfo, Segment
from .osview import OSView, os_view
from .reader import TraceFormatWarning
from .recorder import RecorderWarning

_LAZY = {"Trace", "load", "mark", "record"}


def __getattr__(name):
    # trace.py pulls in the stdlib patches (hooks.py, inspect, ...): load it on first use, so that
    # the core's `from ..trace import recorder` keeps `import mpviz` cheap. Python calls this only
    # when a name is missing, so the names are then bound here: every later `mpviz.trace.mark` is
    # a plain attribute hit (~0.03 µs), not a call that runs an import (~1-3 µs, per event).
    if name in _LAZY:
        from . import trace
        for lazy in _LAZY:
            globals()[lazy] = getattr(trace, lazy)
        return globals()[name]
    raise AttributeError(f"module 'mpviz.trace' has no attribute {name!r}")

__all__ = ["record", "load", "mark", "os_view", "Trace", "Event", "Flow", "Segment",
           "ProcessInfo", "LockInfo", "Hold", "OSView", "RecorderWarning", "TraceFormatWarning"]
