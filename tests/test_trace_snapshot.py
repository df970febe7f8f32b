"""Trace.snapshot(): a copy of a trace's events to draw while the trace grows -- with everything
a drawing reads from the trace, the hang's verdict included (the live widget and the stepper
draw snapshots; the timeline takes its first lanes from the verdict)."""
import os
import subprocess
import sys

import pytest

import mpviz.trace as mt
from test_learner_words import JOIN_BEFORE_GET   # a parent joins a child that cannot end

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
