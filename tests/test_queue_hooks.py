"""mpviz's Queue is recorded by wrappers that mpviz.trace installs (messages.py, "mpviz's own
Queue"); queues.py itself knows nothing of the recorder. These check that nothing is lost by it:
a Queue module imported after recording started, a put that raises, a get that cannot rebuild.
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


@pytest.mark.parametrize("module", ["queues.py", "_codec.py", "_pipe.py"])
def test_the_queue_lesson_imports_nothing_of_the_recorder(module):
    path = os.path.join(ROOT, "mpviz", "multiprocessing", module)
    tree = ast.parse(open(path).read())
    imported = [getattr(node, "module", None) or "" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom)]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names]
    assert not [m for m in imported if "trace" in m], imported


def test_a_queue_module_imported_after_recording_started_is_recorded(tmp_path):
    # As in a spawned child that unpickles its first mpviz Queue: the hooks go in when the
    # first Queue is set up. One message written by put itself, one too big for the pipe
    # (the feeder's road): both linked put -> get.
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
