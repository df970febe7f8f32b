"""The benchmark harness runs end to end (a smoke test: no timing is asserted here)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(100)
def test_bench_quick_runs_and_writes_its_table(tmp_path):
    table = tmp_path / "RESULTS.md"
    result = subprocess.run([sys.executable, "-m", "bench", "--quick", "--markdown", str(table)],
                            cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    text = table.read_text()
    assert "Round trip, tensor already shared" in text and "mpviz fd fork" in text
    assert "floor" in text and "`import mpviz`" in text
    # bench_dataloader_trace.py: real torch, untraced and traced side by side, and the drawing
    assert "DataLoader, 2 workers, 200 batches" in text and "`mpviz trace` ÷ untraced" in text
    assert "drawing timeline + memory map + wait-for" in text
    # bench_distributed.py: all_reduce, torch gloo and mpviz.distributed in the same ranks
    assert "| 2 | 1 MiB |" in text and "mpviz ÷ gloo" in text
