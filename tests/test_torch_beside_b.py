"""Real torch beside the lesson, notebooks 05, 06, 07, 08 and 11: each notebook runs its central
program in real torch (``notebooks/programs/torch_*.py``) under ``python -m mpviz trace`` and
draws it beside mpviz's run. Every sentence it says about that torch run is checked here,
against the same programs run the same way (torch 2.13, CPU):

    05  torch_buffer_reuse.py   6 copies for 24 batches (2 per producer), 24 with ``fresh``;
                                handles with descriptors; torch's fd server is resource_sharer
    06  (inline)                a CPU build: no CUDA, .cuda() fails; the docs' rule, quoted
    07  torch_spawn_error.py    rank 1 exits 1, ranks 0 and 2 by SIGTERM, ProcessRaisedException
    08  torch_hogwild.py        no share_memory(): the parent learns nothing; with it: 4 copies
                                on the parent's lane, the parent learns; fork, nothing pickled
    11  torch_small_shm.py      a real DataLoader in a 64 MiB /dev/shm: 7 batches, then ENOSPC
"""
import json
import os
import re
import shutil
from collections import Counter

import pytest

from mpviz.examples import torch_beside
from mpviz.examples.your_program import ROOT

NOTEBOOKS = os.path.join(ROOT, "notebooks")


def text(notebook):
    """The notebook's markdown, as one string with single spaces."""
    with open(os.path.join(NOTEBOOKS, notebook)) as f:
        cells = json.load(f)["cells"]
    return " ".join(" ".join("".join(c["source"]) for c in cells
                             if c["cell_type"] == "markdown").split())


def code(notebook):
    with open(os.path.join(NOTEBOOKS, notebook)) as f:
        return "\n".join("".join(c["source"]) for c in json.load(f)["cells"]
                         if c["cell_type"] == "code")


@pytest.fixture
def traced():
    """torch_run, its trace folders removed afterwards."""
    pytest.importorskip("torch")
    runs = []

    def run(*args, **kwargs):
        got = torch_beside.torch_run(*args, **kwargs)
        runs.append(got)
        return got
    yield run
    for got in runs:
        if got is not None:
            shutil.rmtree(got.directory, ignore_errors=True)


def names(trace):
    return {p.pid: p.name for p in trace.processes()}


def test_without_torch_torch_run_says_so_in_one_line_and_returns_none(monkeypatch, capsys):
    monkeypatch.setattr(torch_beside, "torch_version", lambda: None)
    assert torch_beside.torch_run("torch_spawn_error.py") is None
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "torch is not installed here" in said


@pytest.mark.timeout(120)
def test_05_torch_copies_each_sent_back_buffer_once_and_every_fresh_batch(traced):
    reuse = traced("torch_buffer_reuse.py", "reuse")
    assert reuse.status == 0, reuse.messages[-2000:]
    who = names(reuse.trace)
    copies = Counter(who[e.pid] for e in reuse.trace.of_kind("copy"))
    assert copies == {"Process-1": 2, "Process-2": 2, "Process-3": 2}, copies
    assert "got 24 batches" in reuse.output
    fds = reuse.trace.of_kind("fd.send")
    assert len(fds) == 48                # every trip, there and back, a descriptor handed over
    threads = {e.args.get("name") for e in reuse.trace.of_kind("thread.start")}
    assert not any("mpviz-fd-peer" in str(t) for t in threads), threads
    assert any("_serve" in str(t) for t in threads), threads   # resource_sharer's thread
    fresh = traced("torch_buffer_reuse.py", "fresh")
    assert len(fresh.trace.of_kind("copy")) == 24
    nb = text("05_buffer_reuse.ipynb")
    assert "Its producers made 6 copies for the 24 batches, 2 per producer" in nb
    assert "and you count 24" in nb and "`resource_sharer` thread" in nb
    assert 'torch_run("torch_buffer_reuse.py", "reuse")' in code("05_buffer_reuse.ipynb")


def test_06_this_torch_has_no_cuda_and_the_notebook_says_what_it_shows():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA build with a GPU: notebook 06's 'the one here' is about CPU builds")
    assert torch.version.cuda is None
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        torch.zeros(3).cuda()
    nb = text("06_cuda_lifetime.ipynb")
    assert "`torch.cuda.is_available()` is `False`, built with CUDA `None`" in nb
    assert ("the sending process is required to keep the original tensor as long as the "
            "receiving process retains a copy of the tensor.") in nb


@pytest.mark.timeout(120)
def test_07_torch_spawn_terminates_the_others_and_raises_with_the_traceback(traced):
    run = traced("torch_spawn_error.py")
    assert run.status == 0, run.messages[-2000:]
    ranks = {p.name: (p.exitcode, p.signal) for p in run.trace.processes()
             if p.name.startswith("SpawnProcess")}
    assert ranks == {"SpawnProcess-1": (-15, "SIGTERM"), "SpawnProcess-2": (1, None),
                     "SpawnProcess-3": (-15, "SIGTERM")}, ranks
    assert "ProcessRaisedException from rank 1" in run.output
    assert run.output.strip().endswith("ValueError: boom from rank 1")
    assert run.messages.count("via signal SIGTERM") == 2
    assert not run.trace.of_kind("mark")             # no teal ticks: the script marks nothing
    nb = text("07_spawn_and_errors.ipynb")
    assert "rank 1's lane (`SpawnProcess-2`) ends with exit code 1" in nb
    assert "ranks 0 and 2 end together by `SIGTERM`" in nb


@pytest.mark.timeout(180)
def test_08_torch_hogwild_without_share_memory_leaves_the_parent_untrained(traced):
    run = traced("torch_hogwild.py")
    assert run.status == 0, run.messages[-2000:]
    trap, shared = run.output.strip().splitlines()
    assert trap.startswith("share_memory()=False under fork: exit codes [0, 0]; the parent's "
                           "parameters changed: False")
    before, after = trap.split("accuracy ")[1].split(" -> ")
    assert before == after
    assert shared.startswith("share_memory()=True under fork: exit codes [0, 0]; the parent's "
                             "parameters changed: True")
    before, after = (float(x.rstrip("%")) for x in shared.split("accuracy ")[1].split(" -> "))
    assert after > before + 30
    program = [p.pid for p in run.trace.processes() if "torch_hogwild.py" in p.name]
    copies = [e for e in run.trace.of_kind("copy")]
    assert len(copies) == 4 and {e.pid for e in copies} == set(program)   # share_memory()
    assert not run.trace.flows()                     # fork: nothing pickled, no arrow
    nb = text("08_hogwild.ipynb")
    assert "the parent's parameters did not change" in nb
    assert "the 4 parameter tensors moved into shared memory, one copy each" in nb


@pytest.mark.timeout(120)
def test_11_a_real_dataloader_runs_out_of_a_64_mib_dev_shm_after_7_batches(traced):
    from mpviz.scenarios.small_shm import _can_make_tmpfs
    possible, why_not = _can_make_tmpfs()
    if not possible:
        pytest.skip(f"no private tmpfs here: {why_not}")
    run = traced("torch_small_shm.py", shm_mb=64)
    assert run.status == 0, run.messages[-2000:]
    # (how many batches main took before the error depends on timing: 5 in a fresh-clone run)
    assert re.match(r"after [1-7] batches: RuntimeError: Caught RuntimeError in DataLoader "
                    r"worker process [0-3]\.", run.output), run.output[:300]
    assert ("unable to allocate shared memory(shm) for file </torch_" in run.output
            and run.output.strip().endswith("No space left on device (28)"))
    workers = {e.pid for e in run.trace.of_kind("dataloader.worker")}
    copies = run.trace.of_kind("copy")
    assert len(copies) == 7 and {e.pid for e in copies} <= workers
    # from the workers: 7 handles of a few hundred bytes, and one message of over 1 KiB (the
    # pickled error that the failing worker sent instead of a batch: the grey arrow)
    sizes = sorted(f.put.args.get("nbytes") or 0 for f in run.trace.flows()
                   if f.put.pid in workers)
    assert len(sizes) == 8 and sizes[-2] < 1000 < sizes[-1], sizes
    nb = text("11_more_pitfalls.ipynb")
    assert "7 batches of 8 MiB were collated into shared memory" in nb
    assert "Caught RuntimeError in DataLoader worker process N" in nb
