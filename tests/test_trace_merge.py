"""Several hosts' traces merged: ``mpviz.trace.load([dir_a, dir_b])`` (mpviz/trace/merge.py).

Two ``python -m mpviz trace`` launches on this machine act as two hosts of one 4-rank job
(tests/dist_programs/two_hosts.py: ranks 0-1 in one, 2-3 in the other, one MASTER_ADDR/PORT),
as a class runs torchrun on each machine. Both hosts share this machine's clock, so the true
offset is 0 -- and after moving one folder's events by a known amount (a transform of the saved
trace), the alignment must find that amount again, within the uncertainty it states.
"""
import os
import re
import subprocess
import sys

import pytest

import mpviz.trace as mt
from mpviz.trace.dist_verdict import judge
from mpviz.trace.merge import PID_STRIDE
from mpviz.trace.trace import Trace
from test_trace_distributed import PROGRAMS, ROOT, _free_port

# every host here runs real torch.distributed (gloo): without torch (the 3.13/3.14 chroots) skip
pytest.importorskip("torch", reason="the hosts run real torch.distributed: torch is not installed")

SETUP_TIMEOUT = 240


def _launch(folder, port, node, library, mode):
    env = dict(os.environ, PYTHONPATH=ROOT, MASTER_PORT=str(port), GLOO_TIMEOUT="90")
    return subprocess.Popen(
        [sys.executable, "-m", "mpviz", "trace", "--hang-after", "2", "--no-plot", "-o",
         str(folder), "--", sys.executable, os.path.join(PROGRAMS, "two_hosts.py"), node,
         library, mode],
        cwd=folder.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Each run's trace folder and (returncode, stderr): every launch at once."""
    tmp = tmp_path_factory.mktemp("hosts")
    train, uneven, one_host = _free_port(), _free_port(), _free_port()
    plan = {"a": (train, "0", "torch", "train"), "b": (train, "1", "torch", "train"),
            "uneven_a": (uneven, "0", "torch", "uneven"),
            "uneven_b": (uneven, "1", "torch", "uneven"),
            "uneven_one_host": (one_host, "all", "torch", "uneven")}
    started = {name: _launch(tmp / name, *args) for name, args in plan.items()}
    return {name: (tmp / name, *finish(proc)) for name, proc in started.items()}


def finish(proc, timeout=SETUP_TIMEOUT - 40):
    """(returncode, stderr) of a traced program; one that outlives `timeout` is killed, with
    its process group (each was started in a session of its own)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
    return proc.returncode, err


def _clock_note(trace, host):
    (note,) = [n for n in trace.notes if n.startswith("the hosts' clocks: ") and
               f"host {host}'s was moved onto" in n]
    return note


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_two_hosts_traces_merge_into_one_job_with_ranks_apart_and_clocks_aligned(hosts):
    (a, code_a, err_a), (b, code_b, err_b) = hosts["a"], hosts["b"]
    assert code_a == 0 and code_b == 0, err_a + err_b
    one_a, one_b = mt.load(a), mt.load(b)
    merged = mt.load([a, b])
    assert [h.name for h in merged.hosts] == ["a", "b"]
    assert len(merged) == len(one_a) + len(one_b)
    ranks = {e.args["rank"]: e.pid for e in merged.of_kind("dist.rendezvous")}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {merged.host_of(ranks[k]) for k in (0, 1)} == {"a"}
    assert {merged.host_of(ranks[k]) for k in (2, 3)} == {"b"}
    b_pids = {p.pid for p in one_b.processes()}
    assert {merged.real_pid(ranks[k]) for k in (2, 3)} <= b_pids
    assert all(p.pid >= PID_STRIDE for p in merged.processes() if merged.host_of(p.pid) == "b")
    assert len(merged.processes()) == len(one_a.processes()) + len(one_b.processes())
    # one clock (this machine's) for both: the true offset is 0, within what the note says
    host_b = merged.hosts[1]
    assert abs(host_b.offset_ns) <= host_b.uncertainty_ns, host_b
    assert host_b.uncertainty_ns < 50e6, host_b          # (bounded by the all_reduces: ms)
    assert f"± {host_b.uncertainty_ns / 1e6:.3f} ms" in _clock_note(merged, "b")
    # every collective of the job is one meeting of the four ranks, #1 to #4 in each
    seqs = {}
    for e in merged.of_kind("dist.collective"):
        if e.args["phase"] == "begin":
            seqs.setdefault(e.args["rank"], []).append((e.args["seq"], e.args["op"]))
    assert all(s == [(1, "all_reduce"), (2, "all_reduce"), (3, "all_reduce"), (4, "barrier")]
               for s in seqs.values()), seqs
    assert merged.verdict is None


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_the_merged_trace_draws_host_and_rank_lanes_joined_at_each_collective(hosts,
                                                                              fonts_loaded):
    from mpviz import viz
    merged = mt.load([hosts["a"][0], hosts["b"][0]])
    ax = viz.timeline(merged).axes[0]
    ticks = [t.get_text().split("\n")[0] for t in ax.get_yticklabels()]
    assert {"a: rank 0", "a: rank 1", "b: rank 2", "b: rank 3"} <= set(ticks), ticks
    (joins,) = [c for c in ax.collections if c.get_gid() == "collective joins"]
    rows = {t.get_text().split("\n")[0]: t.get_position()[1] for t in ax.get_yticklabels()}
    ranks = [rows[f"{host}: rank {k}"] for host, k in (("a", 0), ("a", 1), ("b", 2), ("b", 3))]
    # the rendezvous and the 4 collectives: each line joins the four ranks of both hosts
    assert len(joins.get_segments()) == 5
    for segment in joins.get_segments():
        ys = [y for _, y in segment]
        assert min(ys) <= min(ranks) and max(ys) >= max(ranks), (segment, rows)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_known_clock_offset_is_found_again_within_the_stated_uncertainty(hosts):
    a, b = hosts["a"][0], hosts["b"][0]
    plain = mt.load([a, b]).hosts[1]
    for shift_ns in (3_700_000_000, -250_000_000):
        saved = mt.load(b)           # host b's clock read 3.7 s later (or 0.25 s earlier)
        moved = Trace(events=[e._replace(ts_ns=e.ts_ns + shift_ns) for e in saved])
        moved.path = str(b)          # (its name and notes: as the folder's)
        host = mt.load([a, moved]).hosts[1]
        assert abs(host.offset_ns - (-shift_ns)) <= host.uncertainty_ns, (shift_ns, host)
        assert abs(host.offset_ns - (plain.offset_ns - shift_ns)) <= 1, (shift_ns, host)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_ranks_that_disagree_across_hosts_get_the_verdict_they_get_on_one_host(hosts):
    (ua, _, err_a), (ub, _, err_b) = hosts["uneven_a"], hosts["uneven_b"]
    one, code, err = hosts["uneven_one_host"]
    assert code == 124, err
    merged = mt.load([ua, ub])
    on_one, across = judge(mt.load(one)), judge(merged)
    assert across.sentence == on_one.sentence == (
        "ranks 0, 1, 2 and 3 disagree at collective #3: ranks 0 and 1 called all_reduce #3, "
        "ranks 2 and 3 called barrier #3 (group [0, 1, 2, 3]); each waits for the others to "
        "join its own collective, which they never will."), (across.sentence, err_a, err_b)
    assert across.kind == on_one.kind == "failed"
    # each host alone sees its own ranks wait for ranks it has no process of, and says so (the
    # host whose watchdog fires first: a HANG; the other's ranks then fail, gloo's peers gone)
    for err, (mine, op, theirs) in ((err_a, ("0 and 1", "all_reduce", "2 and 3")),
                                    (err_b, ("2 and 3", "barrier", "0 and 1"))):
        assert re.search(
            rf"\(torch.distributed\) -- ranks {mine} wait(ed)? in {op} #3 for ranks {theirs}, "
            rf"which are in no process of this trace: another host's ranks, or ranks started "
            rf"outside mpviz trace.", err), err
        assert "mpviz.trace.load([folder_a, folder_b]) judges the whole job" in err
    assert merged.verdict.startswith(f"mpviz trace: FAILED (torch.distributed) -- "
                                     f"{across.sentence}")
    ranks = {e.args["rank"]: e.pid for e in merged.of_kind("dist.rendezvous")}
    assert (f"rank 2 (host uneven_b, SpawnProcess-1, pid {merged.real_pid(ranks[2])})"
            in merged.verdict or f"rank 2 (host uneven_b, SpawnProcess-2, pid "
            f"{merged.real_pid(ranks[2])})" in merged.verdict), merged.verdict


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_bad_lists_of_traces_say_what_why_and_fix(hosts, tmp_path):
    a, ua, one = hosts["a"][0], hosts["uneven_a"][0], hosts["uneven_one_host"][0]
    (tmp_path / "notes.txt").write_text("not a trace")
    cases = [([], ValueError, "load([]): no trace to load"),
             ([a, tmp_path], ValueError, "is not a trace: it holds no .mpvlog file"),
             ([a, tmp_path / "missing"], FileNotFoundError, "is not a folder"),
             ([ua, one], ValueError, "rank 0 is in the traces of hosts uneven_a and "
                                     "uneven_one_host"),
             ([a, a], ValueError, "is given twice")]
    for paths, kind, words in cases:
        with pytest.raises(kind) as info:
            mt.load(paths)
        assert words in str(info.value) and "Fix:" in str(info.value), str(info.value)
    # a one-host trace with no rendezvous: nothing to align the clocks at
    with mt.record(tmp_path / "plain"):
        pass
    with pytest.raises(ValueError, match="has no completed rendezvous") as info:
        mt.load([a, tmp_path / "plain"])
    assert "Fix:" in str(info.value)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_one_host_whose_other_host_is_late_is_told_that_its_ranks_may_be_there(tmp_path):
    # a class types the second host's command seconds after the first's: the first host's
    # watchdog sees ranks 2 and 3 never arrive, which a missing process and a late host both
    # look like from one host -- the verdict must not say only the first
    proc = _launch(tmp_path / "a", _free_port(), "0", "mpviz", "train")
    code, err = finish(proc)
    assert code == 124, err
    assert ("HANG: STALLED (mpviz.distributed) -- waiting for 4 ranks at the rendezvous; 2 "
            "arrived (ranks 0 and 1).") in err, err
    assert ("Or, in a job of several hosts (torchrun --nnodes, two_hosts.py), ranks 2 and 3 are "
            "another host's, not started yet: start every host's `mpviz trace` within "
            "--hang-after seconds of the first") in err, err
