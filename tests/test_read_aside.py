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
            time.sleep(3 * ReadAside.EVERY_S)
        assert [e.kind for e in trace.events] == ["process.start"] and aside.take_progress()
        with aside.while_waiting():             # a wait that begins: no progress
            go.set()
            assert done.wait(10)
            done.clear()
            time.sleep(3 * ReadAside.EVERY_S)
        kinds = [e.kind for e in trace.events]
        assert kinds[-1] == "wait.begin" and not aside.take_progress()
        go.set()                                 # held by the main thread: nothing is read
        assert done.wait(10)
        time.sleep(3 * ReadAside.EVERY_S)
        assert [e.kind for e in trace.events] == kinds
        with aside.while_waiting():              # ... until it waits again
            time.sleep(3 * ReadAside.EVERY_S)
        assert "mark" in [e.kind for e in trace.events]
        assert aside.take_progress() and not aside.take_progress()
        assert aside.failed is None
    finally:
        aside.stop()
        child.join(10)
    assert not any(t.name == "mpviz read-aside" for t in threading.enumerate())
    assert child.exitcode == 0
