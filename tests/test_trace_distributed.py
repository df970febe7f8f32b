"""Real torch.distributed (gloo, CPU) traced by ``python -m mpviz trace``: the rendezvous and each
collective recorded per rank, drawn joined, and the distributed classics given true verdicts.

Every program is in tests/dist_programs/, written as its author would (mp.spawn, env://, a
timeout given to init_process_group), and all of them run at once in one fixture:

    ddp_demo_basic     the DDP tutorial's demo_basic          -> rendezvous, DDP's collectives
    one_rank           early-bound names, async_op, barrier   -> seq, bytes, end at wait()
    uneven_batches     rank 0 all_reduce #3, rank 1 barrier #3 -> "ranks 0 and 1 disagree"
    rank_raises        rank 1 raises, rank 0 waits            -> rank 1 named, its exception
    only_rank0         an all_reduce inside `if rank == 0:`   -> rank 1 left, rank 0 waited
    wrong_world_size   world_size 3, 2 processes              -> "waiting for 3 ranks ..."
    ddp_demo_basic     with MASTER_PORT held by a socket      -> "MASTER_PORT ... in use"
    tcp_init_method    init_method="tcp://...:PORT", held     -> "port ... (init_method ...)"
    late_to_rendezvous rank 1 computes 4 s before it joins      -> no hang: it works, then comes
    straggler          rank 1 sleeps before all_reduce #2     -> STALLED, "rank 1 is slow"
    send_wrong_dst     torch's send/recv example, 3 ranks     -> rank 0 never sent to rank 2
    ddp_uneven_loader  DDP, rank 1's DataLoader shorter       -> DEADLOCK: rank 0 in backward()
    ddp_shorter_shard  the same, and rank 1 leaves            -> rank 0 raised in backward()
    all_gather_sizes   all_gather of 5 floats and of 3        -> rank 1 aborted in all_gather #1
    mpviz_send_then_raise  (mpviz.distributed) send/recv, then -> rank 1 left, not "disagree"
                       rank 1 raises before all_reduce #1
    grad_average_shards  gradients all-reduced by hand,     -> all_reduce #5 of 16 bytes and
                       rank 1's loop one step shorter        of 4: sizes differ, a wrong result
    broadcast_group_src  ranks 1, 2 broadcast in their group   -> they raised IN broadcast #1 of
                       with src=0 (not in it), rank 0 barrier   group [1, 2], not "before any"
    last_rank_src      broadcast(src=world_size): every rank -> "every rank raised ... in
                       raises the same error in it               broadcast #1": nobody waited
    save_after_destroy rank 0 takes a Lock twice after         -> "every collective completed,
                       destroy_process_group()                  and rank 0 ... has not exited"
    save_before_destroy the same before it: gloo's threads     -> DEADLOCK, not "unless a loop
                       poll every 10 ms meanwhile                gives up by itself"
"""
import os
import random
import re
import socket
import subprocess
import sys
import time

import pytest

import mpviz.trace as mt
from conftest import hooked_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "dist_programs")
SETUP_TIMEOUT = 240
TEARDOWN_ABORT = "terminate called without an active exception"


_GIVEN = set()


def _free_port():
    """A free port below the range Linux hands out on its own (ip_local_port_range): a port
    the kernel chose (bind to 0) is free only until the next connection takes it -- with many
    runs at once, gloo's own connections did, and a rank's rendezvous failed with EADDRINUSE
    (a fresh-clone run). One given here is taken only by a program that asks for it by number."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port found below {low} in 200 tries. Fix: free some ports")


class _Run:
    """`python -m mpviz trace --hang-after 2 -o tmp/trace -- python PROGRAM args`, in the
    background; ``done()`` waits for it and keeps its status and output."""

    def __init__(self, tmp, program, *args, port=None, plot=False, **env):
        self.tmp, self.port = tmp, port or _free_port()
        env = dict(os.environ, PYTHONPATH=ROOT, MASTER_PORT=str(self.port), **env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mpviz", "trace", "--hang-after", "2",
             "--plot" if plot else "--no-plot", "-o", str(tmp / "trace"), "--", sys.executable,
             os.path.join(PROGRAMS, program), *args],
            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)

    def done(self, timeout):
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.stdout, self.stderr = self.proc.communicate()
        self.returncode = self.proc.returncode

    def trace(self):
        return mt.load(self.tmp / "trace")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    hooked_torch()

    def tmp(name):
        return tmp_path_factory.mktemp(name)
    held = socket.socket()                    # MASTER_PORT taken: someone listens there
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        started = {
            "demo": _Run(tmp("demo"), "ddp_demo_basic.py", plot=True),
            "one rank": _Run(tmp("one"), "one_rank.py", str(tmp("store") / "rendezvous")),
            "uneven": _Run(tmp("uneven"), "uneven_batches.py", GLOO_TIMEOUT="90"),
            "raises": _Run(tmp("raises"), "rank_raises.py", GLOO_TIMEOUT="90"),
            "only rank 0": _Run(tmp("only0"), "only_rank0.py", GLOO_TIMEOUT="90"),
            "world size": _Run(tmp("world"), "wrong_world_size.py", GLOO_TIMEOUT="90"),
            "port": _Run(tmp("port"), "ddp_demo_basic.py", port=held.getsockname()[1]),
            "tcp port": _Run(tmp("tcp_port"), "tcp_init_method.py",
                             str(held.getsockname()[1])),
            "straggler": _Run(tmp("slow"), "straggler.py", GLOO_TIMEOUT="90",
                              SLOW_LOAD="600"),
            "wrong dst": _Run(tmp("dst"), "send_wrong_dst.py", GLOO_TIMEOUT="90"),
            "ddp uneven": _Run(tmp("ddp_uneven"), "ddp_uneven_loader.py", GLOO_TIMEOUT="90"),
            "ddp shorter": _Run(tmp("ddp_shorter"), "ddp_shorter_shard.py", GLOO_TIMEOUT="90"),
            "sizes": _Run(tmp("sizes"), "all_gather_sizes.py", GLOO_TIMEOUT="90"),
            "late": _Run(tmp("late"), "late_to_rendezvous.py", BUILD_SECONDS="4"),
            "mpviz p2p": _Run(tmp("mpviz_p2p"), "mpviz_send_then_raise.py"),
            "grad average": _Run(tmp("grad_average"), "grad_average_shards.py",
                                 GLOO_TIMEOUT="90"),
            "group src": _Run(tmp("group_src"), "broadcast_group_src.py", GLOO_TIMEOUT="90"),
            "last rank src": _Run(tmp("last_src"), "last_rank_src.py"),
            "save after destroy": _Run(tmp("after_destroy"), "save_after_destroy.py"),
            "save before destroy": _Run(tmp("before_destroy"), "save_before_destroy.py"),
        }
        for run in started.values():
            run.done(SETUP_TIMEOUT - 30)
        again = {"demo": lambda: _Run(tmp("demo2"), "ddp_demo_basic.py", plot=True),
                 "ddp shorter": lambda: _Run(tmp("ddp_shorter2"), "ddp_shorter_shard.py",
                                             GLOO_TIMEOUT="90")}
        for name, rerun in again.items():
            if TEARDOWN_ABORT in started[name].stderr:
                # (seen once in ~40 runs of each, at loads of ~13: gloo's teardown aborted a
                # rank after destroy_process_group -- torch's, not what this module checks:
                # once more)
                started[name] = rerun()
                started[name].done(SETUP_TIMEOUT - 30)
    finally:
        held.close()
    return started


def _pids_by_rank(trace):
    return {e.args["rank"]: e.pid for e in trace.of_kind("dist.rendezvous")
            if e.args.get("phase") == "begin"}


def _calls(trace, pid):
    """[(seq, op, nbytes)] of one rank, from its begin events; and its ends' (seq, error)."""
    events = [e for e in trace.of_kind("dist.collective") if e.pid == pid]
    begins = [(e.args["seq"], e.args["op"], e.args["nbytes"]) for e in events
              if e.args["phase"] == "begin"]
    ends = [(e.args["seq"], e.args["error"]) for e in events if e.args["phase"] == "end"]
    return begins, ends


# --- recorded and drawn ----------------------------------------------------------------------

@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_ddp_tutorials_demo_basic_shows_its_rendezvous_and_collectives_per_rank(runs):
    run = runs["demo"]
    assert run.returncode == 0, run.stderr
    trace = run.trace()
    ranks = _pids_by_rank(trace)
    assert sorted(ranks) == [0, 1]
    for rank, pid in ranks.items():
        rdv = [e.args for e in trace.of_kind("dist.rendezvous") if e.pid == pid]
        assert [a["phase"] for a in rdv] == ["begin", "end"]
        assert rdv[1] == dict(phase="end", rank=rank, world_size=2, backend="gloo",
                              init_method="env://", library="torch.distributed", error=None)
        begins, ends = _calls(trace, pid)
        # DDP's construction: its parameter check and its broadcast of the parameters, over
        # the group [0, 1]; 660 bytes = ToyModel's 10*10+10 + 10*5+5 float32s
        assert begins == [(1, "_verify_params_across_processes", 660),
                          (2, "_broadcast_coalesced", 660)]
        assert ends == [(1, None), (2, None)]
    from mpviz.trace.analysis import process_labels
    labels = process_labels(trace)
    assert labels[ranks[0]] == "rank 0" and labels[ranks[1]] == "rank 1"
    # the Reducer's gradient all-reduces are C++: said, never blank time
    assert ("DistributedDataParallel's gradient all-reduces: its Reducer (C++) all-reduces the "
            "gradients in buckets during each loss.backward()") in run.stderr
    assert "660 bytes of gradients (4 parameters) per rank per backward" in run.stderr
    assert os.path.exists(run.tmp / "trace" / "timeline.png")


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_timeline_joins_the_ranks_at_each_collective_at_the_last_arrival(runs, fonts_loaded):
    from mpviz import viz
    trace = runs["demo"].trace()
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    joins = [c for c in ax.collections if c.get_gid() == "collective joins"]
    assert len(joins) == 1
    segments = joins[0].get_segments()
    assert len(segments) == 3                     # the rendezvous and the two collectives
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert any(t.startswith("rank 0\npid ") for t in ticks), ticks
    rows = {segment[0][1] for segment in segments} | {segment[1][1] for segment in segments}
    assert len(rows) == 2                          # each joins the lanes of rank 0 and rank 1
    # hatched before the last arrival, solid after (spans closer than a pixel merge: 1 to 6)
    for gid in ("collective waits", "collectives"):
        (drawn,) = [c for c in ax.collections if c.get_gid() == gid]
        assert 1 <= len(drawn.get_paths()) <= 6


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_ranks_leaving_a_collective_that_worked_a_little_apart_stay_solid(runs, fonts_loaded):
    """The demo's collectives worked: each rank left when its result was there, a little apart
    (more so on a busy machine). The rank that left last is not waiting "for what never comes":
    no hatching after the meeting. (Drawn so before, on a loaded machine: 7 hatched boxes where
    6 waits were.) The run's own events, rank 1 made to leave each collective 80 ms later."""
    from mpviz import viz
    trace = runs["demo"].trace()
    ranks = _pids_by_rank(trace)
    late = mt.Trace(events=[
        e._replace(ts_ns=e.ts_ns + 80_000_000) if (e.pid == ranks[1] and
                                                   e.kind == "dist.collective" and
                                                   e.args["phase"] == "end") else e
        for e in trace.events])
    ax = viz.timeline(late).axes[0]
    row = next(y for y, t in zip(ax.get_yticks(), ax.get_yticklabels())
               if t.get_text().startswith("rank 1\n"))
    ends = {gid: max(p.get_extents().x1 for p in c.get_paths()
                     if abs((p.get_extents().y0 + p.get_extents().y1) / 2 - row) < 0.3)
            for c in ax.collections for gid in [c.get_gid()]
            if gid in ("collective waits", "collectives")}
    assert ends["collectives"] > ends["collective waits"], ends      # solid to its end


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_names_bound_before_the_hooks_are_recorded_with_seq_bytes_and_async_ends(runs):
    run = runs["one rank"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1.0, 1.0, 1.0, 1.0]"
    trace = run.trace()
    (pid,) = _pids_by_rank(trace).values()
    begins, ends = _calls(trace, pid)
    assert begins == [(1, "all_reduce", 16), (2, "all_reduce", 32), (3, "barrier", 0)]
    assert ends == [(1, None), (2, None), (3, None)]
    (destroy,) = trace.of_kind("dist.destroy")
    assert destroy.args == {"rank": 0}


# --- verdicts -----------------------------------------------------------------------------------

@pytest.mark.timeout(SETUP_TIMEOUT)
def test_ranks_that_disagree_at_a_collective_are_a_deadlock_that_names_both_ops(
        runs, fonts_loaded):
    run = runs["uneven"]
    err = run.stderr
    assert run.returncode == 124, err
    assert ("mpviz trace: HANG: DEADLOCK (torch.distributed) -- ranks 0 and 1 disagree at "
            "collective #3: rank 0 called all_reduce #3, rank 1 called barrier #3 (group [0, 1])"
            "; each waits for the others to join its own collective, which they never will."
            ) in err
    pids = _pids_by_rank(run.trace())
    assert f"rank 0 (SpawnProcess-1, pid {pids[0]}): waits in all_reduce #3" in err or \
        f"rank 0 (SpawnProcess-2, pid {pids[0]}): waits in all_reduce #3" in err
    assert "DistributedSampler pads the shards to equal length" in err
    from mpviz import viz
    ax = viz.timeline(run.trace()).axes[0]
    assert [c for c in ax.collections if c.get_gid() == "collectives that disagree"]


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_that_raised_is_named_with_its_exception_while_the_other_waited(runs):
    run = runs["raises"]
    assert run.returncode == 1, run.stderr
    # (rank 1 exits with 1 -- or, as it exits, gloo's teardown aborts it: 1 run in 8 of 2 cores
    # at load 10; or rank 0's error reaches torch's spawn first, which SIGTERMs rank 1 as it
    # exits: 1 run in 5 at load 25. The verdict says each, and it is still rank 1 that raised)
    assert re.search(r"mpviz trace: FAILED \(torch.distributed\) -- rank 1 raised ValueError: "
                     r"sample 1 of rank 1 is corrupt after collective #1 \((exit code 1|later it "
                     r"was killed by SIG(ABRT|TERM))\), without calling all_reduce #2: rank 0 waited in "
                     r"all_reduce #2, which could never complete.", run.stderr), run.stderr
    assert "Fix: read the traceback of the rank that failed" in run.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_collective_inside_if_rank_0_names_the_rank_that_left(runs):
    run = runs["only rank 0"]
    assert run.returncode == 1, run.stderr
    # (rank 1 exits with 0, or is killed by spawn's SIGTERM as it exits: rank 0 failed first)
    head = ("mpviz trace: FAILED (torch.distributed) -- rank 1 called destroy_process_group() "
            "after collective #1")
    assert head in run.stderr, run.stderr
    assert run.stderr.split(head)[1].split("\n")[0] in (
        " and exited with code 0, without calling all_reduce #2: rank 0 waited in all_reduce "
        "#2, which could never complete.",
        " (later it was killed by SIGTERM), without calling all_reduce #2: rank 0 waited in "
        "all_reduce #2, which could never complete.")
    assert "call it on every rank, and use its result on rank 0 only" in run.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_wrong_world_size_is_ranks_waited_for_at_the_rendezvous(runs):
    # (torch's store polls while it waits: its threads move, the rendezvous events do not)
    run = runs["world size"]
    assert run.returncode == 124, run.stderr
    assert ("mpviz trace: HANG: STALLED (torch.distributed) -- waiting for 3 ranks at the "
            "rendezvous; 2 arrived (ranks 0 and 1).") in run.stderr
    assert ("rank 2 never arrived: no process of the program called init_process_group as "
            "rank 2 (world_size is 3; 2 processes did).") in run.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_that_works_before_it_joins_the_rendezvous_is_late_not_missing(runs):
    # (rank 0 waits in init_process_group for 4 s, longer than --hang-after 2: rank 1 computes)
    run = runs["late"]
    assert run.returncode == 0, run.stderr
    assert "HANG" not in run.stderr and "never arrived" not in run.stderr
    assert sorted(run.stdout.split("\n")[:2]) == ["0 done", "1 done"]


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_master_port_in_use_is_said_with_torchs_own_error(runs):
    run = runs["port"]
    assert run.returncode == 1, run.stderr
    pids = _pids_by_rank(run.trace())
    assert (f"mpviz trace: FAILED (torch.distributed) -- rank 0 (SpawnProcess-1, pid {pids[0]})"
            f" could not open the rendezvous: MASTER_PORT {run.port} is already in use") in \
        run.stderr.replace("SpawnProcess-2", "SpawnProcess-1")
    assert (f"torch said: DistNetworkError: The server socket has failed to listen on any local "
            f"network address. port: {run.port}") in run.stderr
    assert "EADDRINUSE" in run.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_port_in_use_named_by_init_method_is_not_called_master_port(runs):
    run = runs["tcp port"]
    err = run.stderr
    assert run.returncode == 1, err
    port = int(run.proc.args[-1])
    assert (f"could not open the rendezvous: port {port} (init_method tcp://127.0.0.1:{port}) "
            f"is already in use") in err, err
    assert "MASTER_PORT" not in err
    assert "Fix: choose a free port (init_method=...)" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_straggler_is_stalled_not_deadlocked_and_named(runs):
    run = runs["straggler"]
    err = run.stderr
    assert run.returncode == 124, err
    assert ("mpviz trace: HANG: STALLED (torch.distributed) -- rank 1 is slow, the others wait "
            "for it in all_reduce #2: rank 0 waits in all_reduce #2.") in err
    assert "DEADLOCK" not in err
    assert "in `time.sleep` (a deadline) -- at load_batch (straggler.py:14)" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_recv_whose_send_went_elsewhere_names_the_send_not_a_disagreement(runs, fonts_loaded):
    # (a send and a recv are no collective: rank 0's send to rank 1 and rank 1's recv from
    # rank 0 agree, though both are call #1 of the group)
    run = runs["wrong dst"]
    err = run.stderr
    assert run.returncode == 1, err
    assert ("mpviz trace: FAILED (torch.distributed) -- rank 0 exited with code 0, without "
            "calling send #1 to rank 2: rank 2 waited in recv #1 from rank 0, which could never "
            "complete.") in err
    assert "disagree" not in err
    assert ("rank 2's recv #1 from rank 0 has no send #1 to rank 2 -- check the dst and src"
            in err)
    from mpviz import viz
    ax = viz.timeline(run.trace()).axes[0]
    assert not [c for c in ax.collections if c.get_gid() == "collectives that disagree"]
    texts = [t.get_text() for t in ax.texts]
    assert "send #1 to rank 1" in texts and \
        "recv #1 from rank 0: rank 0 never came" in texts, texts


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_ddp_rank_with_more_batches_waits_in_backward_a_deadlock_not_a_straggler(runs):
    # (DDP's gradient all-reduce is not seen from Python: rank 0's stack, in backward(), and
    # its DDP say where it is -- it is no slow rank that will come)
    run = runs["ddp uneven"]
    err = run.stderr
    assert run.returncode == 124, err
    assert ("mpviz trace: HANG: DEADLOCK (torch.distributed) -- rank 0 waits inside backward(), "
            "in DistributedDataParallel's gradient all-reduce (C++: not recorded, not counted in "
            "the #), not in barrier #3: rank 1 waits in barrier #3, which can never complete."
            ) in err
    assert "STALLED" not in err and "When the slow rank gets there" not in err
    assert "`with model.join():`" in err
    # the pictures frame what the verdict calls a deadlock as one (STUCK FOR GOOD)
    reasons = {e.args["reason"] for e in run.trace().of_kind("watchdog.stuck")}
    assert reasons == {"deadlock"}, reasons


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_ddp_rank_failing_in_backward_after_another_left_is_named_as_uneven_inputs(runs):
    # (gloo's own words blame "a remote worker crashing": rank 1 ended with code 0)
    run = runs["ddp shorter"]
    err = run.stderr
    assert run.returncode == 1, err
    assert re.search(
        # (gloo's words, 'Connection closed by peer [127.0.0.1]:PORT' in every run seen, are
        # gloo's: whichever it says, the rest is the verdict's)
        r"mpviz trace: FAILED \(torch.distributed\) -- rank 0 raised RuntimeError: [^\n]* "
        r"inside backward\(\), in DistributedDataParallel's "
        r"gradient all-reduce \(C\+\+: not recorded\), which the other ranks never joined: "
        r"rank 1 called destroy_process_group\(\) after collective #2( and exited with code "
        r"0| \(later it was killed by SIGTERM\))\.\n", err), err
    # (rank 1 exits with 0, or is killed by spawn's SIGTERM as it exits: rank 0 failed first)
    assert "`with model.join():`" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_the_backend_aborted_inside_a_collective_is_named_with_its_signal(runs):
    run = runs["sizes"]
    err = run.stderr
    assert run.returncode == 1, err
    assert "Received data size doesn't match expected size" in err     # (gloo's, as it dies)
    assert ("mpviz trace: FAILED (torch.distributed) -- rank 1 was killed by SIGABRT inside "
            "all_gather #1, which every rank of its group had called (ranks 0 and 1): the "
            "backend ended it there.") in err
    assert "Fix: give all_gather tensors of the same shape and dtype on every rank" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_mpviz_distributeds_send_and_recv_do_not_disagree_with_the_collective_after_them(runs):
    # (mpviz numbers a pair's messages apart from the group's collectives: its recv #1 and
    # rank 0's all_reduce #1 are no two ops at one collective)
    run = runs["mpviz p2p"]
    err = run.stderr
    assert run.returncode == 1, err
    assert ("mpviz trace: FAILED (mpviz.distributed) -- rank 1 exited with code 1 before any "
            "collective, without calling all_reduce #1: rank 0 waited in all_reduce #1, which "
            "could never complete.") in err
    assert "disagree" not in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_an_all_reduce_that_meets_one_of_another_size_is_named_with_both_sizes(runs):
    # gloo matches rank 1's epoch-loss all_reduce (4 bytes) with rank 0's 3rd gradient
    # all_reduce (16 bytes): rank 1 completes it with a wrong result and leaves, rank 0 then
    # fails with "Connection closed by peer"; no recorded call is missing
    run = runs["grad average"]
    assert run.returncode == 1, run.stderr
    assert ("mpviz trace: FAILED (torch.distributed) -- ranks 0 and 1 disagree at collective "
            "#5: each called all_reduce #5, with tensors of different sizes: rank 0 16 bytes, "
            "rank 1 4 bytes (group [0, 1]).") in run.stderr, run.stderr
    assert re.search(r"rank 1 \(SpawnProcess-2, pid \d+\): all_reduce #5 completed\n  rank 1's "
                     r"all_reduce #5 completed with no error, on tensors that do not match: "
                     r"its result is wrong", run.stderr), run.stderr
    assert "DistributedSampler pads the shards to equal length" in run.stderr


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_left_alone_in_a_collective_is_drawn_waiting_not_with_every_rank_there(
        runs, fonts_loaded):
    """The same run: rank 1 leaves all_reduce #5 at once, rank 0 stays in it until gloo's
    connection closes: 0.6-9 s as rank 1 prints, destroys its group and exits (1 to 20 runs at
    once), 80 ms where gloo's teardown aborted rank 1 (SIGABRT: 1 run of 4 at load 28). Solid
    means "every rank is there, the backend moves the bytes": drawn so before, rank 0's stay
    said a collective went on that rank 1 had left. From rank 1's leaving on, rank 0's call is
    hatched: it waits for what never comes."""
    from mpviz import viz
    trace = runs["grad average"].trace()
    pids = _pids_by_rank(trace)
    fives = {e.pid: e for e in trace.of_kind("dist.collective")
             if e.args.get("seq") == 5 and e.args.get("phase") == "end"}
    left, stayed = fives[pids[1]].ts_ns, fives[pids[0]].ts_ns
    assert stayed > left, (left, stayed)      # (the story: rank 0 stays on alone)
    ax = viz.timeline(trace).axes[0]
    row = next(y for y, t in zip(ax.get_yticks(), ax.get_yticklabels())
               if t.get_text().startswith("rank 0\n"))

    told = (stayed - left, [e.args for e in trace.of_kind("dist.collective")
                            if e.args.get("seq") == 5])

    def right_end(gid):                         # where rank 0's last box of that kind ends
        drawn = [c for c in ax.collections if c.get_gid() == gid]
        assert len(drawn) == 1, (gid, [c.get_gid() for c in ax.collections], told)
        ends = [b.x1 for b in map(lambda p: p.get_extents(), drawn[0].get_paths())
                if abs((b.y0 + b.y1) / 2 - row) < 0.3]
        assert ends, (gid, "nothing drawn on rank 0's row", told)
        return max(ends)
    hatched, solid = right_end("collective waits"), right_end("collectives")
    assert hatched > solid, (hatched, solid, told)                      # hatched to its end


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_ranks_that_raised_in_another_groups_collective_are_said_to_have_raised_in_it(runs):
    run = runs["group src"]
    err = run.stderr
    assert run.returncode == 1, err
    for k in (1, 2):
        assert re.search(rf"rank {k} raised ValueError: Global rank 0 is not part of group "
                         rf"<[^>]*> in broadcast #1 of group \[1, 2\] \((exit code 1|later it "
                         rf"was killed by SIGTERM)\), without calling barrier #1", err), err
    assert "rank 0 waited in barrier #1, which could never complete." in err
    assert "before any collective" not in err


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("rank0", ["first", "last"])
def test_which_rank_came_first_does_not_change_the_verdict_on_a_group_src(runs, rank0):
    """Rank 0 reaches its barrier before ranks 1 and 2 raise in their broadcast, or after: the
    verdict is the same. (With rank 0's barrier last, mpviz judged the broadcast -- begun first,
    both its ranks there, nobody missing -- and printed no verdict at all: 2 fresh-clone runs
    of 5.)
    The run's own events, rank 0's barrier moved to either side of the broadcasts."""
    from mpviz.trace import dist_verdict
    trace = runs["group src"].trace()
    ranks = _pids_by_rank(trace)
    bcast = [e.ts_ns for e in trace.of_kind("dist.collective")
             if e.args["op"] == "broadcast" and e.args["phase"] == "begin"]
    assert len(bcast) == 2, runs["group src"].stderr
    at = min(bcast) - 1_000_000 if rank0 == "first" else max(bcast) + 1_000_000
    moved = mt.Trace(events=[
        e._replace(ts_ns=at) if (e.pid == ranks[0] and e.kind == "dist.collective" and
                                 e.args["phase"] == "begin") else e for e in trace.events])
    verdict = dist_verdict.judge(moved)
    assert verdict is not None, "no verdict"
    assert verdict.sentence.endswith("rank 0 waited in barrier #1, which could never complete."
                                     ), verdict.sentence
    for k in (1, 2):
        assert f"rank {k} raised ValueError: Global rank 0 is not part of group" in \
            verdict.sentence


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_every_rank_raising_in_the_same_call_is_said_so_and_nobody_waited(runs):
    """broadcast(src=world_size) raises on every rank, in the call itself: no rank is missing,
    none waits -- the verdict says that (before: no verdict at all, only torch's traceback)."""
    run = runs["last rank src"]
    err = run.stderr
    assert run.returncode == 1, err
    assert ("mpviz trace: FAILED (torch.distributed) -- every rank (ranks 0 and 1) raised "
            "RuntimeError: ProcessGroupGloo::broadcast: invalid root rank: 2 in broadcast #1: "
            "the call itself failed, on each rank alike; no rank waited for another.") in err, err
    assert "Fix: the error names what is wrong with the call" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_that_hangs_after_destroying_its_group_is_named_with_its_line(runs):
    """Every collective completed; rank 0 hangs in its own code after destroy_process_group()
    (a Lock taken twice). Said before: the generic "its threads wait for each other", no rank
    named, nothing of torch.distributed. (The same rule found torch 2.13's own teardown hang
    -- ~ProcessGroupGloo waiting on a mutex, gloo's threads polling every 10 ms, which had
    hidden the hang from the watchdog -- in 2 of 16 runs of notebook 12's torch DDP.)"""
    run = runs["save after destroy"]
    err = run.stderr
    assert run.returncode == 124, err
    assert ("HANG: DEADLOCK (torch.distributed) -- every collective completed, and rank 0 "
            "destroyed its group, but has not exited: whoever joins the ranks "
            "(torch.multiprocessing.spawn's join) waits for it.") in err, err
    assert re.search(r"  rank 0 \(SpawnProcess-1, pid \d+\): called destroy_process_group\(\) "
                     r"at [\d.]+ s and has not exited since; its main thread waits for a lock of "
                     r"its own process, with no time limit \(futex\) -- at log "
                     r"\(save_after_destroy\.py:16\): `with _log_lock:`", err), err
    assert "Fix: what it waits for is the program's own" in err, err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_gloos_polling_threads_are_not_taken_for_the_programs_loop(runs):
    """Rank 0 takes a Lock twice while its group is alive: gloo's threads wake every 10 ms to
    poll their sockets. Said before: "DEADLOCK, unless a loop gives up by itself ... Only the
    polling loop of rank 0's native threads can still end this" -- gloo's machinery taken for
    the program's loop (and in notebook 12's torch DDP, their wake-ups hid a hang from the
    watchdog for 80 s: it never fired)."""
    run = runs["save before destroy"]
    err = run.stderr
    assert run.returncode == 124, err
    assert "unless a loop gives up by itself" not in err, err
    assert re.search(r"HANG: DEADLOCK -- .*nobody can ever move\. .*\(In SpawnProcess-1 \(rank 0, "
                     r"pid \d+\), torch\.distributed's own threads \(gloo's\) wake every 10 ms",
                     err), err
    assert "at log (save_before_destroy.py:17): `with _log_lock:`" in err, err


def test_the_watchdog_reads_the_logs_for_a_rendezvous_only_where_a_process_began_one(tmp_path):
    # the rendezvous check read every log once per --hang-after, for every program: a
    # 10,000-batch DataLoader's 240,000 events were decoded again at 10 s, on the machine's
    # 2 cores beside the program, for a rendezvous it never began. Now only where a process
    # of the run flagged one (recorder.flag_rendezvous, at init_process_group's start)
    from mpviz.trace import recorder
    from mpviz.trace.watchdog import Watchdog
    eyes = Watchdog(str(tmp_path), 1.0, lambda: [])
    reads = []
    eyes._read_logs = lambda: reads.append(1) or []
    eyes._dist_looked = 0.0
    assert eyes._rendezvous_stalled(time.monotonic()) is False and reads == []
    recorder.start(str(tmp_path), "record")
    try:
        recorder.flag_rendezvous()
    finally:
        recorder.stop()
    assert os.path.exists(tmp_path / recorder.RENDEZVOUS)
    assert oct(os.stat(tmp_path / recorder.RENDEZVOUS).st_mode & 0o777) == "0o600"
    eyes._dist_looked = 0.0
    assert eyes._rendezvous_stalled(time.monotonic()) is False and reads == [1]


_NAMES_ITSELF_LATE = r"""
import ctypes, select, sys, threading
def loop():
    sys.stdin.readline()                  # (the test lets it name itself after a first look)
    ctypes.CDLL(None).prctl(15, b"gloo_tcp_loop", 0, 0, 0)      # PR_SET_NAME, as gloo does
    print("named", flush=True)
    while True:
        select.select([], [], [], 0.01)   # gloo's poll: every 10 ms, whatever comes
t = threading.Thread(target=loop, daemon=True)
t.start()
print("started", flush=True)
threading.Lock().acquire(); threading.Event().wait()
"""


def test_a_gloo_thread_seen_before_it_named_itself_is_still_known_for_a_poller(tmp_path):
    """gloo's threads name themselves once they run; the watchdog read each thread's name only
    at its first look, and one that looked too early kept its process's name: its polling was
    "the polling loop of rank 0's native thread ... can still end this" (a fresh CI run of
    save_before_destroy.py; 1 in many runs, on a busy machine). The name is read again as it
    runs."""
    from mpviz.trace import watchdog as wd
    proc = subprocess.Popen([sys.executable, "-c", _NAMES_ITSELF_LATE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        eyes = wd.Watchdog(str(tmp_path), 1.0, lambda: [proc.pid])
        eyes._look(time.monotonic())
        loopers = [key for key in eyes.seen if key[1] != proc.pid]
        assert len(loopers) == 1 and not eyes.seen[loopers[0]].poller
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "named\n"
        deadline = time.monotonic() + 10        # (looks until its polls have run: a busy
        while not eyes.seen[loopers[0]].poller and time.monotonic() < deadline:   # machine)
            time.sleep(wd.POLL_SECONDS)
            eyes._look(time.monotonic())
        assert eyes.seen[loopers[0]].poller, \
            "a thread that named itself gloo_tcp_loop after the first look is no poller"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stdin.close()
