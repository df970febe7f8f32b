"""Trace.snapshot(): a copy of a trace's events to draw while the trace grows -- with everything
a drawing reads from the trace, the hang's verdict included (the live widget and the stepper
draw snapshots; the timeline takes its first lanes from the verdict)."""
import os
import subprocess
import sys
import textwrap

import pytest

import mpviz.trace as mt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOIN_BEFORE_GET = textwrap.dedent("""
    import multiprocessing as mp

    def produce(q):
        q.put(b"x" * (1 << 20))   # 1 MiB: the feeder thread blocks on the full pipe

    if __name__ == "__main__":
        q = mp.Queue()
        p = mp.Process(target=produce, args=(q,))
        p.start()
        p.join()                  # waits for the child, which waits for someone to get
        print(len(q.get()))
""")


@pytest.mark.timeout(120)
def test_a_snapshot_of_a_hung_trace_keeps_its_verdict(tmp_path):
    (tmp_path / "prog.py").write_text(JOIN_BEFORE_GET)
    run = subprocess.run(
        [sys.executable, "-m", "mpviz", "trace", "--hang-after", "1", "--no-plot", "-o",
         str(tmp_path / "out"), "--", sys.executable, "prog.py"], cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=100)
    assert run.returncode == 124, run.stderr                  # the watchdog found the hang
    trace = mt.load(tmp_path / "out")
    assert "HANG: DEADLOCK" in trace.verdict
    snapshot = trace.snapshot()
    assert snapshot.verdict == trace.verdict
    assert snapshot.events == trace.events
