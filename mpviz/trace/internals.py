"""The CPython internals the recorder reaches into, checked against the Python that runs it.

Recording hooks private parts of ``multiprocessing`` (hooks.py, messages.py, locks.py, waits.py,
torch_hooks.py): a Queue's ``_reset``, its feeder (``_start_thread``, ``_feed``'s
``send_bytes``), ``SemLock._make_methods``, the fork server's ``_stop``, ``resource_sharer``'s
``register``, ``util._exit_function``... None of these is an API: a new Python may rename or
reshape any of them (3.13 moved ``_exit_function`` out of ``_bootstrap``). Each is checked here,
once, by looking at it -- not by a Python version number::

    CHECKS: (what the recorder would miss, where it hooks, is it there?)
    missing()  ──▶  ["queue messages a Queue's feeder thread writes (mpviz hooks
                      multiprocessing.queues.Queue._start_thread, which this Python 3.15.0
                      does not have)"]

``hooks.install`` skips a hook whose target is gone (no traceback), and ``record()`` / ``mpviz
trace`` then say each line as ``NOT RECORDED: ...`` (a warning, and the trace's notes), instead
of a silently empty picture.
"""
import sys
from multiprocessing import heap, process, queues, spawn, synchronize, util


def _has(owner, *names):
    return all(hasattr(owner, name) for name in names)


def _feed_takes_send_bytes():
    # (its code's parameter names, as inspect.signature would read them, without importing
    # inspect: 4 ms, at the start of every recording)
    code = getattr(getattr(queues.Queue, "_feed", None), "__code__", None)
    return code is not None and \
        "send_bytes" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def _forkserver_can_stop():
    try:
        from multiprocessing import forkserver
    except ImportError:
        return True                     # no fork server on this platform: nothing to miss
    return _has(forkserver.ForkServer, "_stop") and _has(forkserver, "_forkserver")


def _resource_sharer_registers():
    try:
        from multiprocessing import resource_sharer
    except ImportError:
        return True
    return _has(getattr(resource_sharer, "_resource_sharer", None), "register")


def _exit_function_runs_finalizers():
    if sys.version_info < (3, 13):
        return True                     # (before 3.13 it runs inside _bootstrap: not hooked)
    from . import hooks
    fn = getattr(util, "_exit_function", None)
    defaults = hooks._orig.get("_exit_function", getattr(fn, "__defaults__", None)) or ()
    return util._run_finalizers in defaults             # (as it was before hooks.py's hook)


CHECKS = [
    ("queue messages a Queue's feeder thread writes", "multiprocessing.queues.Queue._start_thread",
     lambda: _has(queues.Queue, "_start_thread")),
    ("queue messages a Queue's feeder thread writes", "multiprocessing.queues.Queue._feed's "
     "send_bytes argument", _feed_takes_send_bytes),
    ("lock waits and holds", "multiprocessing.synchronize.SemLock._make_methods",
     lambda: _has(synchronize.SemLock, "_make_methods")),
    ("children of a fork server started before recording", "multiprocessing.forkserver."
     "ForkServer._stop",
     _forkserver_can_stop),
    ("fds torch hands over through resource_sharer",
     "multiprocessing.resource_sharer._resource_sharer.register", _resource_sharer_registers),
    ("when a child ends: after its exit functions, which join its Queues' feeders (it is "
     "recorded when _bootstrap returns)", "multiprocessing.util._exit_function's _run_finalizers",
     _exit_function_runs_finalizers),
    ("Value, Array and RawArray's shared memory (the stdlib heap's arenas)",
     "multiprocessing.heap.Arena", lambda: _has(heap, "Arena")),
    ("spawned children", "multiprocessing.spawn.get_preparation_data and prepare, "
     "multiprocessing.util.spawnv_passfds",
     lambda: _has(spawn, "get_preparation_data", "prepare") and _has(util, "spawnv_passfds")),
    ("children's start and exit", "multiprocessing.process.BaseProcess._bootstrap",
     lambda: _has(process.BaseProcess, "_bootstrap")),
]


def missing():
    """One line per internal this Python lacks: what is not recorded, and why ([]: none)."""
    version = ".".join(map(str, sys.version_info[:3]))
    lines = []
    for what, where, present in CHECKS:
        try:
            ok = present()
        except Exception:
            ok = False
        if not ok:
            lines.append(f"{what} (mpviz hooks {where}, which this Python {version} does not "
                         f"have)")
    return lines
