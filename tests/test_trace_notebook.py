"""Recording from a Jupyter kernel: children under every start method record by themselves."""
import json
import os
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

SETUP = f"""
import sys
sys.path[:0] = [{ROOT!r}, {TESTS!r}]
import json, multiprocessing as mp
import mpviz.trace as mt
import trace_workers as w
"""

RUN = """
summary = {}
for method in ["fork", "spawn", "forkserver"]:
    ctx = mp.get_context(method)
    with mt.record() as trace:
        q, results = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=w.producer, args=(q, 4, "mpviz_nb_seg")),
                 ctx.Process(target=w.consumer, args=(q, results, "mpviz_nb_seg"))]
        for p in procs:
            p.start()
        got = results.get()
        for p in procs:
            p.join()
    info = {p.pid: p for p in trace.processes()}
    flows = [f for f in trace.flows() if f.put.pid == procs[0].pid]
    summary[method] = dict(
        got=got,
        how=[info[p.pid].how if p.pid in info else None for p in procs],
        exits=[info[p.pid].exitcode for p in procs],
        recorded=[any(e.pid == p.pid for e in trace.events) for p in procs],
        linked=[f.get is not None and f.get.pid == procs[1].pid for f in flows],
        attached=[s.attached_by for s in trace.segments()] == [(procs[1].pid,)])
from multiprocessing import forkserver
forkserver._forkserver._stop()
print(json.dumps(summary))
"""


# nbclient runs in a subprocess of its own: its ZeroMQ context keeps sockets open for the life of
# the process, which the leak check after each test would (rightly) report.
DRIVER = """
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
nbclient.NotebookClient(nb, timeout=150, kernel_name="python3",
                        resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[1])
"""


@pytest.mark.timeout(180)
def test_record_from_a_notebook_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(RUN)]
    path = tmp_path / "record.ipynb"
    nbformat.write(nb, path)
    run = subprocess.run([sys.executable, "-c", DRIVER, str(path), str(tmp_path)],
                         capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = nbformat.read(path, as_version=4).cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream"
                   and o.name == "stdout")
    assert text, outputs
    summary = json.loads(text.strip().splitlines()[-1])
    for method in ("fork", "spawn", "forkserver"):
        s = summary[method]
        assert s["got"] == [0, 1, 2, 3], (method, s)
        assert s["recorded"] == [True, True] and s["how"] == [method, method], (method, s)
        assert s["exits"] == [0, 0] and s["linked"] == [True] * 5 and s["attached"], (method, s)
