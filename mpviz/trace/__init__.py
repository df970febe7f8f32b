"""Recording what every process does, and reading it back.

    with mpviz.trace.record() as trace:      # this process + every process started inside
        ...                                   # (fork, spawn, forkserver, Pool workers)
    trace.events / processes() / flows() / segments() / locks() / to_chrome("t.json")
    trace = mpviz.trace.load("some/dir")      # afterwards, or from a killed run
    mpviz.trace.mark("epoch", n=3)            # your own event
    mpviz.trace.os_view(pid)                  # what the OS says: mapped /dev/shm names, fds

One mark's tour to the picture, in five files (docs/TOUR.md, "mark("x") → the picture"):

    mark("x")           trace.py     hands ("x", args) to this process's Writer, if recording
     -> Writer.mark     recorder.py  one record: [length|checksum|time|thread|kind|args], copied
                                     into the memory-mapped log <pid>-<n>.mpvlog (writer.c: the
                                     same Writer in C, the same bytes), in the kernel's page cache
     -> LogReader.poll  reader.py    reads each log's new records, checks and decodes them
     -> Trace.events    trace.py     Events of every process, merged by time; the views
     -> Trace.plot      trace/analysis.py and viz/timeline.py: the marks, a tick on their lane each
    q.put(x)            queues.py    mpviz's Queue emits queue.put where it writes (helpers, and
                                     the stdlib Queue's hooks: messages.py); then recorder.py,
                                     reader.py as above; Trace.flows() pairs it with its get

The rest: hooks.py, locks.py, waits.py (the patches), autostart/ (a fresh interpreter joining),
events.py (KINDS), analysis.py (what pictures and verdicts read), watchdog.py, session.py (hangs;
a run's processes), chrome.py, osview.py (/proc), native.py.
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
    # a plain attribute hit, not a call that runs an import on every event.
    if name in _LAZY:
        from . import trace
        for lazy in _LAZY:
            globals()[lazy] = getattr(trace, lazy)
        return globals()[name]
    if name == "messages":      # mpviz's Queue, recording before anything loaded it (a launcher)
        import importlib        # (not `from . import`: that asks this function again)
        return importlib.import_module(__name__ + ".messages")
    raise AttributeError(f"module 'mpviz.trace' has no attribute {name!r}")

__all__ = ["record", "load", "mark", "os_view", "Trace", "Event", "Flow", "Segment",
           "ProcessInfo", "LockInfo", "Hold", "OSView", "RecorderWarning", "TraceFormatWarning"]
