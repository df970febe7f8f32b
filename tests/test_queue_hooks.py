"""mpviz's Queue records itself, at the line where each fact happens, behind one flag read
(``if recorder.ENABLED:``), as mpviz/sharing/ does; no module of mpviz.trace patches it (only the
stdlib's classes, whose code we cannot edit, are wrapped: messages.py's hooks). These check that
style, and that nothing is lost by it: a Queue module imported after recording started, a put
that raises, a get that cannot rebuild.
"""
import ast
import os
import queue
import subprocess
import sys
import textwrap

import pytest

import mpviz
import mpviz.multiprocessing as mp
import mpviz.trace as mt
from mpviz.multiprocessing.queues import QueueClosedError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(120)


def _recorder_modules():
    folder = os.path.join(ROOT, "mpviz", "trace")
    return [os.path.join(here, name) for here, _, names in os.walk(folder)
            for name in names if name.endswith(".py")]


QUEUE_MODULES = ("queues", "_pipe", "_codec")       # mpviz/multiprocessing/: the Queue lesson


def test_no_module_of_the_recorder_patches_mpvizs_own_queue():
    # mpviz's Queue is our code: it records itself. A module of trace/ that imports it, or names
    # it in a string (to find it in sys.modules and wrap it), patches it from outside again.
    found = []
    for path in _recorder_modules():
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            found += [(os.path.relpath(path, ROOT), node.lineno, name) for name in names
                      if name.startswith(("mpviz.multiprocessing", "..multiprocessing"))]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [(os.path.relpath(path, ROOT), node.lineno, word)
                          for word in node.value.split() if word.strip("\"'`(),.:").startswith(
                              tuple(f"mpviz.multiprocessing.{m}" for m in QUEUE_MODULES))]
    assert not found, (f"{found}: a module of mpviz.trace reaches for mpviz's own Queue. Fix: "
                       f"record the fact in mpviz/multiprocessing/ where it happens, behind "
                       f"`if recorder.ENABLED:`, calling a helper of trace/messages.py")


RECORDING = ("recorder.", "trace.messages.", "messages.")   # what a line of recording calls
GUARDS = ("recorder.ENABLED", "recorder.writer")               # the one flag read it is behind


@pytest.mark.parametrize("module", ["queues.py", "_pipe.py"])
def test_mpvizs_queue_records_each_fact_behind_one_flag_read(module):
    path = os.path.join(ROOT, "mpviz", "multiprocessing", module)
    tree = ast.parse(open(path).read(), path)
    guarded, bare = [], []

    def visit(node, guard):
        if isinstance(node, ast.If) and any(g in ast.unparse(node.test) for g in GUARDS):
            guard = True
        if isinstance(node, ast.Call) and ast.unparse(node.func).startswith(RECORDING):
            (guarded if guard else bare).append((node.lineno, ast.unparse(node.func)))
        for child in ast.iter_child_nodes(node):
            visit(child, guard)
    visit(tree, False)
    assert not bare, f"{module}: recording not behind `if recorder.ENABLED:` (line, call): {bare}"
    assert guarded, f"{module} records nothing itself: who records its facts?"


def test_importing_mpvizs_queue_loads_neither_numpy_nor_the_recorders_helpers():
    # queues.py reaches trace/messages.py only while recording (trace.messages): a spawned
    # child that passes numbers starts as light as before.
    run = subprocess.run([sys.executable, "-c", "import sys, mpviz.multiprocessing; print("
                          "[m for m in ('numpy', 'mpviz.trace.messages', 'mpviz.trace.hooks') "
                          "if m in sys.modules])"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_a_queue_module_imported_after_recording_started_is_recorded(tmp_path):
    # As in a spawned child that unpickles its first mpviz Queue: the hooks go in when the
    # first Queue is set up. One message written by put itself, one too big for the pipe
    # (the feeder's way): both linked put -> get.
    code = textwrap.dedent(f"""
        import sys
        import mpviz.trace as mt
        with mt.record({str(tmp_path / "t")!r}) as trace:
            assert "mpviz.multiprocessing.queues" not in sys.modules
            import mpviz.multiprocessing as mp
            q = mp.get_context("fork").Queue()
            q.put("small")
            q.put(b"x" * 200_000)
            assert q.get(timeout=30) == "small" and len(q.get(timeout=30)) == 200_000
            q.close()
            q.join_thread()
        flows = trace.flows()
        print(len(flows), sum(f.get is not None for f in flows), len(trace.of_kind("queue.feed")))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["2", "2", "1"]


class _BrokenOnArrival:
    """Pickles fine; unpickling it raises (as a tensor whose sender's memory is gone does)."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise RuntimeError("cannot be rebuilt here")


def test_a_put_that_raises_and_a_get_that_cannot_rebuild_are_recorded(tmp_path):
    q = mp.get_context("fork").Queue(maxsize=1)
    with mt.record(tmp_path / "t") as trace:
        q.put(_BrokenOnArrival())
        with pytest.raises(queue.Full):
            q.put(mpviz.ones(2), False)
        with pytest.raises(RuntimeError, match="cannot be rebuilt"):
            q.get(timeout=10)
        q.close()
        with pytest.raises(QueueClosedError):
            q.put(1)
    failed = [e.args["error"] for e in trace.of_kind("queue.put_failed")]
    assert failed == ["Full", "QueueClosedError"]
    assert [e.args["error"] for e in trace.of_kind("queue.get_failed")] == ["RuntimeError"]
    (flow,) = trace.flows()                       # the one put that entered the queue
    assert flow.get is not None
