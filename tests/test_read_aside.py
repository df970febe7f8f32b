"""The launcher reads the logs while the program runs (watchdog.ReadAside): only while the
launcher's main thread waits, and what it read as progress is kept for the watchdog's next look. A real recording process writes the log; a real thread reads it."""
import multiprocessing as mp
import threading
import time

import pytest

from mpviz.trace import recorder
from mpviz.trace.trace import Trace
from mpviz.trace.watchdog import ReadAside

pytestmark = pytest.mark.timeout(60)


def _writer(directory, go, done, kinds):
    """A recorded process that emits one event of each of `kinds` each time it is told to."""
    recorder.start(directory, "fork")
    for kind in kinds:
        go.wait()
        go.clear()
        recorder.emit(kind, n=1)
        done.set()
    recorder.stop()


def _kinds(trace):
    return [e.kind for e in list(trace.events)]


def _until(condition, seconds=10.0):
    """Poll `condition` (the thread reads every EVERY_S) until true or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_reads_only_while_the_main_thread_waits_and_keeps_progress(tmp_path):
    ctx = mp.get_context("fork")
    go, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_writer, args=(str(tmp_path), go, done,
                                              ["wait.begin", "mark"]))
    child.start()
    trace = Trace(str(tmp_path))
    aside = ReadAside(trace)
    try:
        with aside.while_waiting():             # the child's start: progress
            assert _until(lambda: _kinds(trace) == ["process.start"]), _kinds(trace)
        assert aside.take_progress()
        with aside.while_waiting():             # a wait that begins: no progress
            go.set()
            assert done.wait(10)
            done.clear()
            assert _until(lambda: _kinds(trace)[-1:] == ["wait.begin"]), _kinds(trace)
        kinds = _kinds(trace)
        assert not aside.take_progress()
        go.set()                                 # held by the main thread: nothing is read
        assert done.wait(10)
        # (an absence cannot be waited for: three of the thread's periods pass, then we look)
        time.sleep(3 * ReadAside.EVERY_S)
        assert _kinds(trace) == kinds
        with aside.while_waiting():              # ... until it waits again
            assert _until(lambda: "mark" in _kinds(trace)), _kinds(trace)
        assert aside.take_progress() and not aside.take_progress()
        assert aside.failed is None
    finally:
        aside.stop()
        child.join(10)
    assert not any(t.name == "mpviz read-aside" for t in threading.enumerate())
    assert child.exitcode == 0
