"""Never a false zero (issue 27): what mpviz can see it records; what it cannot, it names.

Each program here is written as its author would write it (sharedctypes shared with children,
a DataLoader, pytorch/examples' mnist_hogwild shape, a loop that sends tensors, a program run
with ``python -I``, one that starts torch.distributed) and is run as a user runs it:
``python -m mpviz trace -o DIR -- python prog.py``. All of them are started at once by the first
test that needs one (torch's import costs ~2 s of CPU a process, and they mostly wait).
"""
import json
import re
import sys
import textwrap

import pytest

import mpviz.trace as mt
import mpviz.viz as viz
from test_trace_torch import _Run as _Background   # (a program in the background)
from conftest import hooked_torch

SETUP_TIMEOUT = 240

SHAREDCTYPES = textwrap.dedent("""
    import multiprocessing as mp
    import sys

    def work(counter, squares, i):
        with counter.get_lock():
            counter.value += 1
        squares[i] = i * i

    if __name__ == "__main__":
        mp.set_start_method(sys.argv[1])
        counter = mp.Value("i", 0)
        squares = mp.Array("d", 4)
        workers = [mp.Process(target=work, args=(counter, squares, i)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print(counter.value, list(squares))
""")

DATALOADER = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Ramp(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            return torch.full((256,), float(i))

    if __name__ == "__main__":
        total = 0.0
        for batch in DataLoader(Ramp(), batch_size=8, num_workers=2):
            total += batch.sum().item()
        print(total)
""")

HOGWILD = textwrap.dedent("""
    # the shape of pytorch/examples' mnist_hogwild: the model reaches its workers as an argument
    import torch
    import torch.multiprocessing as mp
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 2)

        def forward(self, x):
            return self.fc(x)

    def train(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 10)).sum().backward()
            optimizer.step()

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        model = Net()
        model.share_memory()
        processes = []
        for rank in range(2):
            p = mp.Process(target=train, args=(model,))
            p.start()
            processes.append(p)
        for p in processes:
            p.join()
""")

CHURN = textwrap.dedent("""
    # sends 300 tensors through a queue; each process samples /proc/self/maps as it goes
    import json
    import sys
    import torch
    import torch.multiprocessing as mp

    def mapped():
        with open("/proc/self/maps") as f:
            return len({line.split()[5] for line in f if "/dev/shm/torch_" in line})

    def consume(q, n, out):
        most = 0
        for _ in range(n):
            t = q.get()
            most = max(most, mapped())
            del t
        out.put(most)

    if __name__ == "__main__":
        n = 300
        q, out = mp.Queue(8), mp.Queue()
        p = mp.Process(target=consume, args=(q, n, out))
        p.start()
        most = 0
        for i in range(n):
            q.put(torch.full((64,), float(i)))
            most = max(most, mapped())
        with open(sys.argv[1], "w") as f:
            json.dump({"producer": most, "consumer": out.get(), "consumer_pid": p.pid}, f)
        p.join()
""")

QUEUE = textwrap.dedent("""
    import multiprocessing as mp

    def child(q):
        q.put("hello")

    if __name__ == "__main__":
        q = mp.Queue()
        p = mp.Process(target=child, args=(q,))
        p.start()
        print(q.get())
        p.join()
""")

DISTRIBUTED = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist

    if __name__ == "__main__":
        dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0,
                                world_size=1)
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.destroy_process_group()
        print(t.tolist())
""")


class _Run(_Background):
    """`python -m mpviz trace -o tmp/trace [options] -- python [python_args] prog.py [args]`,
    started in the background; ``done()`` (test_trace_torch's) waits and keeps its output."""

    def __init__(self, tmp, source, *args, options=(), python_args=()):
        (tmp / "prog.py").write_text(source)
        super().__init__(tmp, [sys.executable, "-m", "mpviz", "trace", "-o", str(tmp / "trace"),
                               *options, "--", sys.executable, *python_args, "prog.py", *args])

    def trace(self):
        assert self.proc.returncode == 0, self.stderr
        return mt.load(self.tmp / "trace")


def _program(trace):
    """The pid of the program the launcher ran."""
    (program,) = [p.pid for p in trace.processes() if p.how == "exec"]
    return program


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    hooked_torch()

    def tmp(name):
        return tmp_path_factory.mktemp(name)
    store = tmp("store") / "rendezvous"
    started = {
        "sharedctypes fork": _Run(tmp("sct"), SHAREDCTYPES, "fork"),
        "sharedctypes spawn": _Run(tmp("sct"), SHAREDCTYPES, "spawn"),
        "dataloader": _Run(tmp("dl"), DATALOADER),
        "hogwild": _Run(tmp("hog"), HOGWILD),
        "churn": _Run(tmp("churn"), CHURN, "seen.json"),
        "isolated": _Run(tmp("iso"), QUEUE, python_args=("-I",)),
        "distributed": _Run(tmp("dist"), DISTRIBUTED, str(store)),
    }
    for run in started.values():
        run.done(SETUP_TIMEOUT - 30)
    return started


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sharedctypes_values_and_arrays_are_segments_with_sizes_and_mappers(runs, method):
    run = runs[f"sharedctypes {method}"]
    trace = run.trace()
    assert run.stdout.strip() == "4 [0.0, 1.0, 4.0, 9.0]"
    program = _program(trace)
    children = {p.pid for p in trace.processes() if p.ppid == program and p.how == method}
    assert len(children) == 4
    # Value("i") and Array("d", 4) live in one arena of the stdlib's heap: one page
    (arena,) = trace.segments()
    assert re.fullmatch(r"/pym-\d+-\w+", arena.name)
    assert (arena.nbytes, arena.strategy, arena.created_by) == (4096, "file_descriptor", program)
    assert set(arena.attached_by) == children
    summary = viz.summary(trace)
    assert "1 segments;" in summary
    assert "sharedctypes (Value, Array): 1 heap arena (4 KiB) in shared memory, mapped by 5 " \
           "processes" in summary
    arrows = [f for f in trace.flows() if str(f.channel).startswith("args-")]
    if method == "spawn":          # the arena's fd travels in each child's pickled arguments
        assert sorted(f.get.pid for f in arrows) == sorted(children)
        assert all(f.put.args["handles"] == 1 and f.put.args["nbytes"] > 0 for f in arrows)
        assert "4 messages: 4 carried shared-memory handles" in summary
    else:                          # fork: nothing pickled, the mapping is inherited
        assert arrows == []


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_dataloader_workers_collate_is_a_copy_into_shared_memory(runs):
    run = runs["dataloader"]
    trace = run.trace()
    assert float(run.stdout) == sum(range(24)) * 256.0
    workers = {e.pid for e in trace.of_kind("dataloader.worker")}
    copies = trace.of_kind("copy")
    # 3 batches of 8 samples of 256 float32s, each stacked by a worker into a new segment
    assert len(copies) == 3 and {e.pid for e in copies} <= workers
    assert {(e.args["via"], e.args["nbytes"]) for e in copies} == {("collate", 8 * 256 * 4)}
    assert {e.args["name"] for e in copies} == {s.name for s in trace.segments()}
    assert "3 copies into shared memory (24 KiB)" in viz.summary(trace)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_hogwild_model_reaches_each_worker_as_an_arrow(runs):
    trace = runs["hogwild"].trace()
    program = _program(trace)
    workers = {p.pid for p in trace.processes() if p.ppid == program and p.how == "spawn"}
    arrows = [f for f in trace.flows() if str(f.channel).startswith("args-")]
    assert len(workers) == 2 and {(f.put.pid, f.get.pid) for f in arrows} == \
        {(program, w) for w in workers}
    # Linear(10, 2): its weight and its bias, each a shared storage whose fd travels
    assert [f.put.args["handles"] for f in arrows] == [2, 2]
    names = viz.channel_names(trace)
    assert {names[f.channel] for f in arrows} == {f"the arguments of pid {w}" for w in workers}
    summary = viz.summary(trace)
    assert "2 messages: 2 carried shared-memory handles (4 in all" in summary
    assert "4 fds handed over" in summary


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_memory_map_counts_what_proc_says_was_mapped_not_every_segment_ever_made(runs):
    run = runs["churn"]
    trace = run.trace()
    seen = json.loads((run.tmp / "seen.json").read_text())
    program = _program(trace)
    from mpviz.trace import analysis as st
    ix = st._index(trace)
    most = {program: 0, seen["consumer_pid"]: 0}
    for e in ix.shm:                       # every instant a mapping began: who mapped how many
        per = {}
        for s in ix.segment_states(e.ts_ns):
            for pid in s.mapped_by:
                per[pid] = per.get(pid, 0) + 1
        for pid in most:
            most[pid] = max(most[pid], per.get(pid, 0))
    assert len(trace.of_kind("shm.create")) == 300
    # /proc/self/maps, sampled by the program, is the truth; the trace may be behind it by the
    # 8 segments a process maps between two looks (torch_hooks.LOOK_EVERY), never by 300
    assert seen["producer"] <= most[program] <= seen["producer"] + 8, (most, seen)
    assert seen["consumer"] <= most[seen["consumer_pid"]] <= seen["consumer"] + 8, (most, seen)
    assert {e.args.get("how") for e in trace.of_kind("shm.detach")} <= \
        {"storage freed", "/proc/self/maps"}


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_program_run_with_python_I_is_not_recorded_and_the_report_says_why(runs):
    run = runs["isolated"]
    assert run.proc.returncode == 0 and run.stdout.strip() == "hello"
    err = run.stderr
    assert re.search(r"NOT RECORDED: the program \(pid \d+: \S+ -I prog\.py\) recorded nothing: "
                     r"python -I \(isolated mode\) ignores PYTHONPATH and skips site", err), err
    assert "unknown, not zero" in err and "Fix: run it without -I (" in err and \
        " prog.py), or record from inside the program" in err
    assert not re.search(r"events from 1 process(es)? in", err), err
    assert "all of them mpviz's own: the program recorded nothing" in err
    summary = viz.summary(mt.load(run.tmp / "trace"))
    assert "0 segments + unknown (NOT RECORDED below)" in summary
    assert "NOT RECORDED: the program" in summary
    assert "0 messages + unknown (NOT RECORDED below): " in summary     # not "0 messages"


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_torch_distributed_is_a_not_recorded_line(runs):
    run = runs["distributed"]
    trace = run.trace()
    assert run.stdout.strip() == "[1.0, 1.0, 1.0, 1.0]"
    program = _program(trace)
    # its collectives are recorded (test_trace_distributed.py); what gloo does inside them is
    # C++, and said so
    line = (f"pid {program}: torch.distributed: gloo's own threads, and the bytes they move "
            f"over its sockets, run in C++")
    assert f"NOT RECORDED: {line}" in run.stderr, run.stderr
    assert "Fix: " in run.stderr.split(line)[1]
    summary = viz.summary(trace)
    assert f"NOT RECORDED: {line}" in summary and "0 segments + unknown" in summary
    assert "0 messages + unknown (NOT RECORDED below): " in summary  # all_reduce moved bytes


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_each_picture_of_a_run_with_a_part_not_recorded_says_so_under_it_once(runs,
                                                                               fonts_loaded):
    trace = runs["distributed"].trace()

    def said(fig):
        return [t.get_text() for t in fig.texts if t.get_gid() == "not recorded"]
    for draw in (viz.timeline, viz.wait_for, viz.plot):     # trace.plot() is the timeline
        fig = draw(trace)
        (words,) = said(fig)
        assert words.startswith("NOT RECORDED: pid ") and "torch.distributed" in words, words
        viz.notes_under(fig, trace.notes)    # (the launcher's pictures get them so too)
        assert len(said(fig)) == 1
