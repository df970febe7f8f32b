"""Real torch under ``python -m mpviz trace``: what torch shared is seen, and matches the OS.

Each program in tests/torch_workers.py runs once per module and writes what /proc/PID/maps and
/dev/shm said; the tests hold the trace against it. torch's import costs ~2 s of CPU a process,
and the programs mostly wait (on each other, on a queue), so every program this module runs --
the traced ones and the small ``python -c`` ones -- is started at once, side by side, by the
first test that needs one; several tests then look at each run.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mpviz.trace as mt  # noqa: E402
import mpviz.viz as viz  # noqa: E402
from mpviz.trace import analysis as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "torch_workers.py")
TENSOR_BYTES = 65536 * 4
TWICE_BYTES = 1000 * 4
pytestmark = pytest.mark.skipif(not torch.__version__.startswith("2.13"),
                                reason="the torch hooks know torch 2.13 only")
# The first test to need a run waits for all of them (its timeout counts that wait).
SETUP_TIMEOUT = 300


def _program(trace):
    (program,) = [p for p in trace.processes() if p.how == "exec"]
    return program


def _torch(trace, kind, pid=None):
    return [e for e in trace.of_kind(kind) if e.args.get("torch") and pid in (None, e.pid)]


class _Run:
    """One program started in the background: a torch_workers.py program under the CLI, or a
    ``python -c`` script; ``done()`` waits for it and keeps its status and output."""

    def __init__(self, tmp, argv):
        self.tmp = tmp
        self.proc = subprocess.Popen(argv, cwd=tmp, env=dict(os.environ, PYTHONPATH=ROOT),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def done(self, timeout):
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
        self.returncode = self.proc.returncode


def _traced(tmp, *args):
    """Start a torch_workers.py program under the CLI (trace in tmp/trace, report in tmp)."""
    return _Run(tmp, [sys.executable, "-m", "mpviz", "trace", "-o", str(tmp / "trace"), "--",
                      sys.executable, WORKERS, *args, str(tmp / "report.json")])


def _script(tmp, source):
    return _Run(tmp, [sys.executable, "-c", source])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every program of this module, started at once and all waited for here (so that no test
    sees another's processes still running): {name: _Run}."""
    def tmp(name):
        return tmp_path_factory.mktemp(name)
    started = {
        "queue file_descriptor": _traced(tmp("q"), "queue", "file_descriptor"),
        "queue file_system": _traced(tmp("q"), "queue", "file_system"),
        "hogwild": _traced(tmp("hogwild"), "hogwild"),
        "dataloader": _traced(tmp("dataloader"), "dataloader"),
        "hooked": _script(tmp("hooked"), HOOKED),
        "unsupported": _script(tmp("unsupported"), UNSUPPORTED),
        "broken hook": _script(tmp("broken"), BROKEN_HOOK),
    }
    for run in started.values():
        run.done(timeout=SETUP_TIMEOUT - 60)
    return started


def _result(run):
    """A traced run's (trace, what the OS said), once it ended well."""
    assert run.returncode == 0, run.stderr
    assert "NOT recorded" not in run.stderr, run.stderr
    with open(run.tmp / "report.json") as f:
        return mt.load(run.tmp / "trace"), json.load(f)


@pytest.fixture(scope="module", params=["file_descriptor", "file_system"])
def queue_run(request, runs):
    trace, seen = _result(runs[f"queue {request.param}"])
    return request.param, trace, seen


@pytest.fixture(scope="module")
def hogwild_run(runs):
    return _result(runs["hogwild"])


@pytest.fixture(scope="module")
def dataloader_run(runs):
    return _result(runs["dataloader"])


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_segments_and_copies_are_torchs_own(queue_run):
    strategy, trace, seen = queue_run
    producer, consumer = seen["producer"], seen["pid"]
    segs = {s.name: s for s in trace.segments()}
    # the names /proc/<consumer>/maps showed while it held the tensors: exactly the trace's
    assert set(segs) == set(seen["maps"]) and len(segs) == 11
    assert sorted(s.nbytes for s in segs.values()) == [TWICE_BYTES] + [TENSOR_BYTES] * 10
    for s in segs.values():
        assert (s.strategy, s.created_by, s.attached_by) == (strategy, producer, (consumer,))
    # the tensor sent twice: mapped once, then found in torch's receive cache (same storage)
    assert seen["same_storage"]
    (hit,) = _torch(trace, "shm.cache", consumer)
    assert hit.args["hit"] and segs[hit.args["name"]].nbytes == TWICE_BYTES
    assert [e.args["name"] for e in _torch(trace, "shm.attach")].count(hit.args["name"]) == 1
    if strategy == "file_descriptor":        # unlinked at once: mapped "(deleted)", no name left
        assert all(seen["maps"].values()) and not set(seen["dev_shm"]) & set(segs)
    else:                                    # named: in /dev/shm while the consumer held them
        assert not any(seen["maps"].values()) and set(segs) <= set(seen["dev_shm"])
    copies = _torch(trace, "copy", producer)
    assert sorted(e.args["name"] for e in copies) == sorted(segs)     # one each, not two
    assert sum(e.args["nbytes"] for e in copies) == 10 * TENSOR_BYTES + TWICE_BYTES
    summary = viz.summary(trace)
    assert "11 segments;" in summary and "11 copies into shared memory" in summary
    assert "1 receive-cache hits" in summary


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_tensor_messages_are_drawn_as_handles(queue_run):
    strategy, trace, seen = queue_run
    handles = st._index(trace).handles
    tensor_q = {e.args["queue"] for e in trace.of_kind("queue.put") if e.pid == seen["producer"]}
    tensors = [f for f in trace.flows() if f.channel in tensor_q]
    others = [f for f in trace.flows() if f.channel not in tensor_q]
    assert len(tensors) == 12 and all(f.get is not None for f in tensors)
    assert all(f.put.args["msg"] in handles for f in tensors)
    assert not any(f.put.args["msg"] in handles for f in others)    # the report, fd requests
    assert "12 carried shared-memory handles" in viz.summary(trace)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_fd_hand_over_is_linked_to_its_message(queue_run):
    strategy, trace, seen = queue_run
    handles = _torch(trace, "shm.handle", seen["producer"])
    sent, received = _torch(trace, "fd.send"), _torch(trace, "fd.recv")
    if strategy == "file_system":          # by name: no fd travels; torch's manager gets a lane
        assert not sent and not received
        assert {e.args["via"] for e in handles} == {"name"}
        managers = [p for p in trace.processes() if p.name == "torch_shm_manager"]
        assert len(managers) == 1 and managers[0].ppid == seen["producer"]
        states = {s.status for s in st.state_at(trace).segments}
        assert states == {"unlink not seen (torch)"}               # never "leaked", never "0"
        fig = viz.memory_map(trace)                                 # and the picture says so
        words = [t.get_text() for t in fig.axes[0].texts]
        assert words.count("unlink not seen\n(torch)") == 11 and "LEAKED" not in words
        return
    by_token = {e.args["token"]: e.args["name"] for e in handles}
    assert len(by_token) == 12 and None not in by_token        # the one sent twice: 2 fds
    # the producer's resource_sharer thread sent each fd, the consumer received it
    assert {(e.args["token"], e.args["name"]) for e in sent} == set(by_token.items())
    assert {(e.args["token"], e.args["name"]) for e in received} == set(by_token.items())
    assert {e.pid for e in sent} == {seen["producer"]} and \
        {e.tid for e in sent} != {seen["producer"]}
    assert {e.pid for e in received} == {seen["pid"]}
    # each hand-over is linked to the message whose handle it served: the tensor messages
    tensor_msgs = {f.put.args["msg"] for f in trace.flows()
                   if f.put.pid == seen["producer"] and f.put.kind == "queue.put"}
    assert {st.fd_message(trace, e) for e in sent + received} == tensor_msgs
    assert len(tensor_msgs) == 12


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_fd_hand_overs_are_drawn_as_dashed_arrows(queue_run):
    strategy, trace, seen = queue_run
    from matplotlib.colors import to_hex
    from matplotlib.patches import FancyArrowPatch
    from mpviz.viz.colors import COLORS, WORDS
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    drawn = [p for p in ax.patches if isinstance(p, FancyArrowPatch) and p.get_gid() == "fd"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    if strategy == "file_system":              # names, not fds: no fd arrow, no legend line
        assert not drawn and WORDS["fd"] not in legend
        return
    passes = st.fd_passes(trace)
    assert len(passes) == 12 and len(drawn) == 12 and WORDS["fd"] in legend
    for arrow in drawn:                        # thin, dashed, in the fd colour
        assert to_hex(arrow.get_edgecolor()) == COLORS["fd"]
        assert arrow.get_linestyle() != "-" and arrow.get_linewidth() < 1.5
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    starts = sorted(round(a._posA_posB[0][1]) for a in drawn)
    ends = sorted(round(a._posA_posB[1][1]) for a in drawn)
    # from the producer's resource_sharer thread to the consumer's lane
    assert {lanes[r] for r in starts} == {"└ Thread-1 (_serve)"}
    consumer = [i for i, lane in enumerate(lanes) if f"pid {seen['pid']}" in lane]
    assert set(ends) == set(consumer)
    # each starts when the fd was sent and ends when it was received
    xs = sorted((a._posA_posB[0][0], a._posA_posB[1][0]) for a in drawn)
    assert all(x0 <= x1 for x0, x1 in xs)
    # linked to its message: a dotted line from the fd's end to that message's get, where
    # the get is drawn apart from it (torch's get is recorded before it unpickles: earlier)
    (links,) = [c for c in ax.collections if c.get_gid() == "fd link"]
    assert 1 <= len(links.get_segments()) <= 12
    fd_ends = {tuple(np.round(a._posA_posB[1], 9)) for a in drawn}
    handle_gets = {tuple(np.round(a._posA_posB[1], 9)) for a in ax.patches
                   if isinstance(a, FancyArrowPatch) and a.get_gid() != "fd" and
                   to_hex(a.get_edgecolor()) == COLORS["handle"]}
    for b, g in links.get_segments():
        assert tuple(np.round(b, 9)) in fd_ends and tuple(np.round(g, 9)) in handle_gets
    gets = {f.put.args["msg"]: f.get for f in trace.flows() if f.get is not None}
    for send, recv in passes:
        message = st.fd_message(trace, recv)
        assert message is not None and gets[message].pid == recv.pid
        assert gets[message].ts_ns <= recv.ts_ns


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_fd_requests_are_not_messages_but_are_drawn_into_serve(queue_run):
    """The consumer's request to the producer's resource_sharer (torch's pickled (key, pid)) is
    recorded once, with the hand-over (fd.recv's request_ns, request_nbytes): no pipe.send or
    pipe.recv, no envelope for _serve to unpickle. The timeline still draws it: a grey arrow
    from the consumer's thread, when it asked, to the _serve thread, when it answered."""
    strategy, trace, seen = queue_run
    from matplotlib.colors import to_hex
    from matplotlib.patches import FancyArrowPatch
    from multiprocessing.reduction import ForkingPickler
    from mpviz.viz.colors import COLORS
    producer, consumer = seen["producer"], seen["pid"]
    # the producer's _serve thread receives no message at all: nothing it reads is a message
    serve = {e.tid for e in _torch(trace, "fd.send", producer)}
    assert not [f for f in trace.flows() if f.get is not None and
                (f.get.pid, f.get.tid) in {(producer, t) for t in serve}]
    assert not [e for e in trace.of_kind("pipe.send") if e.pid == consumer]
    requests = st.fd_requests(trace)
    if strategy == "file_system":               # by name: nothing is asked for
        assert not requests and not serve
        return
    passes = st.fd_passes(trace)
    assert len(requests) == len(passes) == 12
    for r in requests:
        key = int(r.recv.args["token"].rsplit("#", 1)[1])
        # its true size: the bytes torch's request is, as Connection.send pickles it
        assert r.nbytes == len(ForkingPickler.dumps((key, consumer))), r
        assert (r.put.pid, r.get.pid) == (consumer, producer) and r.get.tid in serve
        assert r.get.kind == "fd.send" and r.get.args["token"] == r.recv.args["token"]
        assert r.put.ts_ns < r.get.ts_ns < r.recv.ts_ns        # asked, answered, received
        assert r.put.tid == r.recv.tid                          # the thread that unpickled
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    into_serve = [a for a in ax.patches if isinstance(a, FancyArrowPatch) and a.get_gid() != "fd"
                  and lanes[round(a._posA_posB[1][1])] == "└ Thread-1 (_serve)"]
    assert len(into_serve) == 12, [lanes[round(a._posA_posB[1][1])] for a in ax.patches]
    assert {to_hex(a.get_edgecolor()) for a in into_serve} == {COLORS["message"]}
    # grey as a message, but the legend says what they are (they are not counted as messages)
    from mpviz.viz.colors import WORDS
    said = [t.get_text() for legend in fig.legends + [ax.get_legend()] if legend is not None
            for t in legend.get_texts()]
    assert WORDS["fd_request"] in said, said
    assert {lanes[round(a._posA_posB[0][1])] for a in into_serve} == \
        {lane for lane in lanes if f"pid {consumer}" in lane}
    summary = viz.summary(trace)
    sizes = sorted({r.nbytes for r in requests})
    each = f"{sizes[0]} B" if len(sizes) == 1 else f"{sizes[0]} B–{sizes[-1]} B"
    assert f"12 fds handed over (12 asked for by a request of {each} to the sender's " \
        f"resource_sharer thread: hand-overs, not counted among the messages)" in summary, summary
    assert f"{len(trace.flows())} messages" in summary


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_hogwild_parameter_segments_are_mapped_by_every_worker(hogwild_run):
    trace, seen = hogwild_run
    program = _program(trace).pid
    trainers = {w["pid"] for w in seen["workers"]}
    segs = trace.segments()
    assert sorted(s.nbytes for s in segs) == sorted(seen["params"])
    for s in segs:
        assert s.created_by == program and set(s.attached_by) == trainers
        for w in seen["workers"]:               # what each trainer's /proc/PID/maps said
            assert s.name in w["maps"]
    creates = _torch(trace, "shm.create", program)
    assert {e.args["via"] for e in creates} == {"share_memory_"}
    (shared,) = _torch(trace, "torch.share_memory")
    assert shared.args["tensors"] == 4 and shared.args["nbytes"] == sum(seen["params"])
    assert {e.args.get("how") for e in _torch(trace, "shm.attach")} == {"fork"}
    labels = st.process_labels(trace)
    assert {labels[p] for p in trainers} == {"trainer 0", "trainer 1"}


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_dataloader_batches_are_arrows_from_each_worker(dataloader_run):
    trace, seen = dataloader_run
    assert seen["sums"] == [sum(range(k, k + 8)) * 1024.0 for k in (0, 8, 16, 24)]
    program = _program(trace).pid
    labels = st.process_labels(trace)
    workers = {pid for pid, label in labels.items() if label.startswith("DataLoader worker")}
    assert sorted(labels[p] for p in workers) == ["DataLoader worker 0", "DataLoader worker 1"]
    phases = sorted((e.args["worker_id"], e.args["phase"]) for e in _torch(trace,
                                                                          "dataloader.worker"))
    assert phases == [(0, "exit"), (0, "start"), (1, "exit"), (1, "start")]
    handles = st._index(trace).handles
    batches = [f for f in trace.flows() if f.put.pid in workers and f.get is not None
               and f.get.pid == program and f.put.args["msg"] in handles]
    assert sorted(labels[f.put.pid] for f in batches) == ["DataLoader worker 0"] * 2 + \
        ["DataLoader worker 1"] * 2
    # each batch: collate copies the worker's samples into a new segment (issue 27: a copy)
    made = _torch(trace, "shm.create")
    assert len(made) == 4 and {e.pid for e in made} == workers
    assert {(e.args["via"], e.args["nbytes"]) for e in made} == {("_new_shared", 8 * 1024 * 4)}
    copies = trace.of_kind("copy")
    assert sorted(e.args["name"] for e in copies) == sorted(e.args["name"] for e in made)
    assert {(e.pid in workers, e.args["via"], e.args["nbytes"]) for e in copies} == \
        {(True, "collate", 8 * 1024 * 4)}


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_dataloader_pin_memory_is_what_torch_did(dataloader_run):
    trace, seen = dataloader_run
    program = _program(trace).pid
    pins = _torch(trace, "dataloader.pin_memory")
    pinned = _torch(trace, "dataloader.pin")
    threads = {st._index(trace).thread_name(e.pid, e.tid) for e in pins}
    if not seen["accelerator"]:
        # a CPU-only torch: it warned, started no pin-memory thread and pinned nothing; the
        # trace says so (once, from the main process), and draws no such thread
        assert any("pin_memory" in w and "no accelerator" in w for w in seen["warnings"])
        (skipped,) = pins
        assert skipped.pid == program and skipped.args["phase"] == "skipped"
        assert "no pin-memory thread" in skipped.args["reason"] and not pinned
        lanes = [t.get_text() for t in viz.timeline(trace).axes[0].get_yticklabels()]
        assert not any("_pin_memory_loop" in lane for lane in lanes)
        return
    # with an accelerator (not on a CPU-only machine): the thread, and each batch pinned in it
    assert sorted(e.args["phase"] for e in pins) == ["exit", "start"]
    assert {e.pid for e in pins} == {program} and len({e.tid for e in pins}) == 1
    assert [e.args["nbytes"] for e in pinned] == [8 * 1024 * 4] * 4
    assert {e.tid for e in pinned} == {pins[0].tid} and threads


HOOKED = textwrap.dedent("""
    import json, torch
    import mpviz.trace as mt
    from multiprocessing.reduction import ForkingPickler
    import torch.multiprocessing.reductions as R
    from torch.utils.data import dataloader as D
    from torch.utils.data._utils import pin_memory as P

    def torchs(f):                       # the wrapper keeps torch's own function, and its name
        inner = getattr(f, "__wrapped__", None)
        return inner is not None and (f.__module__, f.__qualname__) == \
            (inner.__module__, inner.__qualname__)

    def outcome(call):                   # what a call returned or raised, as text
        try:
            return "returned " + type(call()).__name__
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"

    # an empty CUDA storage on a CPU-only torch: torch's own error, unchanged
    cuda_args = (torch.Tensor, (0,), (1,), 0, torch.storage.TypedStorage, torch.float32,
                 0, None, 0, 0, False, None, 0, None, False)
    with mt.record() as trace:
        hooked = {name: torchs(f) for name, f in [
            ("reduce_tensor", R.reduce_tensor), ("rebuild_cuda_tensor", R.rebuild_cuda_tensor),
            ("_pin_memory_loop", P._pin_memory_loop), ("pin_memory", P.pin_memory),
            ("_BaseDataLoaderIter.__init__", D._BaseDataLoaderIter.__init__)]}
        table = ForkingPickler._extra_reducers
        tensor_classes = [table[c] is R.reduce_tensor
                          for c in list(torch._tensor_classes) + [torch.Tensor,
                                                                  torch.nn.Parameter]]
        t = torch.arange(6.0)
        back = ForkingPickler.loads(bytes(ForkingPickler.dumps(t)))   # CPU: through it
        cuda = [outcome(lambda: f(*cuda_args)) for f in (R.rebuild_cuda_tensor,
                                                         R.rebuild_cuda_tensor.__wrapped__)]
        pinned = [outcome(lambda: f(t)) for f in (P.pin_memory, P.pin_memory.__wrapped__)]
    print(json.dumps({"hooked": hooked, "tensor_classes": tensor_classes,
                      "back": back.tolist(), "cuda": cuda, "pinned": pinned,
                      "kinds": sorted({e.kind for e in trace.events
                                       if e.kind.startswith(("cuda.", "dataloader."))})}))
""")


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_cuda_and_pin_memory_hooks_sit_on_torchs_own_functions(runs):
    """CUDA and pinning need a GPU; what a CPU-only machine can check: the hooks wrap torch's
    real functions (by the names torch looks them up by), and a call goes through unchanged."""
    run = runs["hooked"]
    assert run.returncode == 0, run.stderr
    assert "NOT recorded" not in run.stderr, run.stderr
    seen = json.loads(run.stdout.splitlines()[-1])
    assert all(seen["hooked"].values()), seen["hooked"]
    assert all(seen["tensor_classes"])              # every tensor class pickles through it
    assert seen["back"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    hooked, plain = seen["cuda"]                    # the same result, or the same error
    assert hooked == plain
    hooked, plain = seen["pinned"]
    assert hooked == plain
    if not torch.cuda.is_available():               # nothing opened, nothing pinned: no event
        assert seen["kinds"] == []


CUDA_QUEUE = textwrap.dedent("""
    import torch, torch.multiprocessing as mp
    import mpviz.trace as mt

    def consume(q, done):
        t = q.get()
        t2 = q.get()                     # the same storage again: torch's cache, no new open
        assert float(t.sum()) == 1024.0 and t2.data_ptr() == t.data_ptr()
        del t, t2
        done.set()

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        with mt.record(path="trace") as trace:
            q, done = ctx.Queue(), ctx.Event()
            c = ctx.Process(target=consume, args=(q, done))
            c.start()
            x = torch.ones(1024, device="cuda")
            q.put(x)
            q.put(x)
            done.wait()
            c.join()
        sends = trace.of_kind("cuda.send")
        opens = trace.of_kind("cuda.ipc_open")
        print(len(sends), len(opens), sends[0].args["nbytes"],
              sends[0].args["block"] == opens[0].args["block"],
              opens[0].pid == c.pid)
""")


@pytest.mark.timeout(120)
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() "
                           "is False here): the IPC handle path cannot run")
def test_a_cuda_tensor_on_a_queue_is_an_ipc_handle(tmp_path):
    (tmp_path / "prog.py").write_text(CUDA_QUEUE)
    run = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=100, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr
    # two handles pickled (the tensor sent twice), one open (the second from torch's cache)
    assert run.stdout.split() == ["2", "1", str(1024 * 4), "True", "True"], run.stdout


UNSUPPORTED = textwrap.dedent("""
    import torch
    torch.__version__ = "2.12.1"          # as an older torch would say
    import mpviz.trace as mt, mpviz.viz as viz
    with mt.record() as trace:
        t = torch.zeros(10).share_memory_()
    print(viz.summary(trace))
""")


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_an_unsupported_torch_says_not_recorded(runs):
    run = runs["unsupported"]
    assert run.returncode == 0, run.stderr
    assert "torch's shared memory is NOT recorded" in run.stderr and "2.12.1" in run.stderr
    summary = run.stdout
    assert "NOT RECORDED: torch's shared memory was NOT recorded in 1 process" in summary
    assert "unknown, not zero" in summary
    assert "0 segments (torch's: unknown, NOT recorded)" in summary     # not a bare "0"


BROKEN_HOOK = textwrap.dedent("""
    import os, torch
    import mpviz.trace as mt, mpviz.viz as viz
    with mt.record() as trace:
        first = torch.zeros(10).share_memory_()     # recorded
        real = os.readlink
        os.readlink = None                # the hook's own step fails ...
        t = torch.zeros(10).share_memory_()
        os.readlink = real
        u = torch.ones(4).share_memory_()
    print(t.is_shared(), u.is_shared())   # ... the user's calls went through anyway
    print(len(trace.of_kind("shm.create")))
    print(viz.summary(trace))
""")


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_hook_that_fails_turns_itself_off_and_says_so(runs):
    run = runs["broken hook"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[:2] == ["True True", "1"]
    assert "NOT recorded" in run.stderr and "TypeError" in run.stderr
    assert "NOT RECORDED: torch's shared memory was NOT recorded" in run.stdout


def test_two_cuda_blocks_whose_handles_share_a_prefix_get_two_names():
    # A cudaIpcMemHandle_t is 64 opaque bytes; blocks of one process may share a long prefix.
    # The block's name (the same in sender and receiver) must tell them apart.
    from mpviz.trace import torch_hooks
    first = bytes(range(32)) + b"\x01" * 32
    second = bytes(range(32)) + b"\x02" * 32
    name = lambda handle, offset=0: torch_hooks._cuda_block(   # noqa: E731
        {"storage_device": 0, "storage_handle": handle, "storage_offset_bytes": offset})
    assert name(first) != name(second)
    assert name(first) == name(bytearray(first))        # the receiver's copy names it alike
    assert name(first, 512) != name(first) and name(first).startswith("cuda:0/")


def test_a_second_record_in_one_process_lists_only_the_torch_segments_it_saw():
    # A student records twice in one kernel. The first recording's segments, freed since, are
    # no part of the second: the second must not list them as let go (shm.detach). Its own
    # segments, freed while it records, it must still see let go.
    def torch_names(trace, kind):
        return {e.args["name"] for e in _torch(trace, kind)}

    with mt.record() as first:
        earlier = [torch.full((256,), float(i)).share_memory_() for i in range(8)]
    del earlier                                       # freed between the two recordings
    with mt.record() as second:
        own = [torch.full((256,), float(i)).share_memory_() for i in range(8)]
        del own                                       # freed while the second records ...
        kept = [torch.full((256,), float(i)).share_memory_() for i in range(8)]   # ... seen here
    del kept
    made = torch_names(second, "shm.create")
    assert len(torch_names(first, "shm.create")) == 8 and len(made) == 16
    assert torch_names(second, "shm.detach") <= made, "the first recording's segments listed"
    creates = sorted(_torch(second, "shm.create"), key=lambda e: e.ts_ns)
    assert {e.args["name"] for e in creates[:8]} <= torch_names(second, "shm.detach")
    assert all(s.created_ns for s in second.segments() if s.name.startswith("/torch_"))


def test_a_reused_fd_number_is_named_for_the_file_it_holds_now():
    """_fd_name keeps each fd's answer (a readlink costs ~10 us, and a sender asks twice per
    segment); a number closed and given to another file, or another file dup2'd onto it, must
    still be named for the file it holds now, never for the one it held."""
    from mpviz.trace import torch_hooks
    first = os.memfd_create("mpviz-fd-first")
    number = first
    assert torch_hooks._fd_name(number) == "/memfd:mpviz-fd-first"
    assert torch_hooks._fd_name(number) == "/memfd:mpviz-fd-first"      # (now from the cache)
    other = os.memfd_create("mpviz-fd-second")
    try:
        os.dup2(other, number)                  # another file put on the same number
        assert torch_hooks._fd_name(number) == "/memfd:mpviz-fd-second"
        os.close(number)                        # closed, and the number handed out again
        third = os.memfd_create("mpviz-fd-third")
        if third != number:
            os.dup2(third, number)
            os.close(third)
        assert torch_hooks._fd_name(number, os.fstat(number)) == "/memfd:mpviz-fd-third"
    finally:
        os.close(other)
        os.close(number)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_queue_fd_requests_are_flows_in_the_chrome_export(queue_run):
    """Perfetto shows each request as the timeline does: an arrow from the asker's thread, when
    it asked, to the sender's _serve thread, when it answered (a flow between two zero-length
    slices); the export still validates (slices nest, flows match one to one)."""
    from test_trace_chrome import validate
    strategy, trace, seen = queue_run
    data = trace.to_chrome()
    assert validate(data) == []
    asks = [ev for ev in data["traceEvents"] if ev.get("name", "").startswith("ask for an fd")]
    answers = [ev for ev in data["traceEvents"] if ev.get("name") == "hand the fd over"]
    if strategy == "file_system":
        assert not asks and not answers
        return
    requests = st.fd_requests(trace)
    assert len(asks) == len(answers) == len(requests) == 12
    by_flow = {ev["bind_id"]: ev for ev in answers}
    for ask in asks:
        answer = by_flow[ask["bind_id"]]
        assert ask["flow_out"] and answer["flow_in"] and ask["ts"] < answer["ts"]
        assert (ask["pid"], answer["pid"]) == (seen["pid"], seen["producer"])
        assert ask["name"] == f"ask for an fd ({ask['args']['nbytes']} B)"


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("name", ["queue file_descriptor", "queue file_system", "hogwild",
                                  "dataloader"])
def test_perfetto_ends_each_segment_when_the_memory_map_calls_it_freed(runs, name):
    """trace.json's segment slices and its "shm bytes live" counter say what the memory map
    says: a torch segment unmapped by every process that mapped it is freed (file_descriptor:
    there is no name to unlink), not "open at end". (Before: a slice ended only at an unlink,
    which torch never records, so a DataLoader's every batch segment read "open at end" and
    the counter only ever rose.)"""
    trace, _seen = _result(runs[name])
    data = trace.to_chrome()
    events = data["traceEvents"]
    segments = {s.name: s for s in st.state_at(trace).segments}
    begun = {ev["id2"]["global"] for ev in events if ev.get("cat") == "shm" and ev["ph"] == "b"}
    open_at_end = {ev["id2"]["global"] for ev in events if ev.get("cat") == "shm" and
                   ev["ph"] == "e" and ev["args"].get("open_at_end")}
    assert begun and begun <= set(segments)
    assert open_at_end == {n for n in begun if segments[n].status != "freed"}
    live = [ev["args"]["bytes"] for ev in events if ev.get("name") == "shm bytes live"]
    assert live[-1] == sum(segments[n].nbytes for n in open_at_end)
    spans = {}                                 # each segment's slice, from b to e
    for ev in events:
        if ev.get("cat") == "shm" and ev["ph"] in "be":
            spans.setdefault(ev["id2"]["global"], []).append(ev["ts"])
    for ev in events:                          # every attach, detach, handle: inside its slice
        if ev.get("cat") == "shm" and ev["ph"] == "n" and ev["id2"]["global"] in spans:
            begin, end = spans[ev["id2"]["global"]]
            assert begin <= ev["ts"] <= end, ev
    # Between the sender's unmap and the receiver's map, a segment with no name is on its
    # way (its fd held by resource_sharer), not freed
    between = _sent_before_received(trace)
    for seg, t in between:
        assert {s.name: s.status for s in st.state_at(trace, t).segments}[seg] == \
            "not mapped yet"
    if name == "dataloader":                   # every batch's segment, freed on both sides
        assert len(begun) >= 4 and not open_at_end and live[-1] == 0


def _sent_before_received(trace):
    """(segment, an instant) where the sender had unmapped a torch file_descriptor segment and
    the receiver had not mapped it yet."""
    out, detached = [], {}
    for e in trace.of_kind("shm.detach", "shm.attach"):
        name = e.args.get("name")
        if e.args.get("strategy") != "file_descriptor" or not e.args.get("torch"):
            continue
        if e.kind == "shm.detach" and name not in detached:
            detached[name] = e.ts_ns
        elif e.kind == "shm.attach" and name in detached and detached[name] < e.ts_ns - 1:
            out.append((name, (detached[name] + e.ts_ns) // 2))
    return out
