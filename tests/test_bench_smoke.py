"""The benchmark harness runs end to end (a smoke test: no timing is asserted here)."""
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """The text of one ``python -m bench --quick`` run's Markdown table."""
    path = tmp_path_factory.mktemp("bench") / "RESULTS.md"
    result = subprocess.run([sys.executable, "-m", "bench", "--quick", "--markdown", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    return path.read_text()


@pytest.mark.timeout(100)
def test_bench_quick_runs_and_writes_its_table(table):
    text = table
    assert "Round trip, tensor already shared" in text and "mpviz fd fork" in text
    assert "floor" in text and "`import mpviz`" in text
    # bench_waits.py: its last table (it called messages.waiting_get with an old signature)
    assert "| mpviz Queue |" in text, text[text.find("## bench_waits.py"):][:2000]


@pytest.mark.timeout(100)
def test_bench_quick_measures_real_torchs_dataloader_and_gloo(table):
    if importlib.util.find_spec("torch") is None:     # (the 3.13/3.14 chroots)
        pytest.skip("these rows run real torch (a DataLoader; gloo): torch is not installed")
    text = table
    # bench_dataloader_trace.py: real torch, untraced and traced side by side, and the drawing
    assert "DataLoader, 2 workers, 200 batches" in text and "`mpviz trace` ÷ untraced" in text
    assert "drawing timeline + memory map + wait-for" in text
    # bench_distributed.py: all_reduce, torch gloo and mpviz.distributed in the same ranks
    assert "| 2 | 1 MiB |" in text and "mpviz ÷ gloo" in text
