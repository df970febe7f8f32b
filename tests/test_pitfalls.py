"""The pitfalls of torch's multiprocessing that have their own scenario here: both sides of each
flip, with real processes, bounded by the scenario's watchdog.

Each case runs on the side that shows the pitfall and on the side of its fix; the verdict must
name what happened (torch's own words where torch has them) and the fix. After every run no
process of the run is alive and none of its /dev/shm segments is left (the autouse leak check
in conftest.py checks our own fds, children and /dev/shm too).
"""
import json
import os
import subprocess
import sys

import pytest

import mpviz.scenarios as sc
from mpviz.trace import session
from proc_helpers import run_with_small_dev_shm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEW = ["cuda-in-forked-child", "autograd-fork", "small-shm", "oom-killed", "forkserver-default",
       "non-leaf-put"]


def run(name, **params):
    result = sc.run(name, **params)
    assert result.problem is None, result.explanation + "\n" + result.output[-3000:]
    assert result.duration_s <= 30
    sid = result.details["driver_pid"]
    assert session.session_pids(sid) == [], "processes of the run are still alive"
    left = [n for n in session.run_segments(result.trace) if os.path.exists("/dev/shm" + n)]
    assert left == [], f"segments of the run left in /dev/shm: {left}"
    return result


def test_every_pitfall_is_listed_by_the_cli():
    out = subprocess.run([sys.executable, "-m", "mpviz", "list"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert out.returncode == 0
    for name in NEW:
        assert name in sc.names() and name in out.stdout


@pytest.mark.skipif("fork" not in sc.module("cuda-in-forked-child").PARAMS["start_method"].choices,
                    reason="fork is POSIX only")
def test_cuda_in_a_forked_child_is_refused_and_spawn_fixes_it():
    bad = run("cuda-in-forked-child", start_method="fork")
    assert bad.outcome == "error"
    assert bad.details["child"][0] == "CudaForkError"
    assert "Cannot re-initialize CUDA in forked subprocess" in bad.explanation
    assert "spawn" in bad.explanation
    good = run("cuda-in-forked-child", start_method="spawn")
    assert good.outcome == "ok" and good.details["child"] == ["ok", 2.0]


@pytest.mark.skipif("fork" not in sc.module("autograd-fork").PARAMS["start_method"].choices,
                    reason="fork is POSIX only")
def test_backward_in_a_child_forked_after_gpu_autograd_is_refused_and_spawn_fixes_it():
    bad = run("autograd-fork")
    assert bad.outcome == "error" and bad.details["child"][0] == "AutogradForkError"
    assert "Unable to handle autograd's threading in combination with fork-based " \
           "multiprocessing" in bad.explanation and "spawn" in bad.explanation
    good = run("autograd-fork", start_method="spawn")
    assert good.outcome == "ok" and good.details["child"] == ["ok", [2.0, 2.0, 2.0]]
    cpu = run("autograd-fork", device="cpu")        # no device in use: no mark, as in torch
    assert cpu.outcome == "ok"


def _torch_backward_in_forked_child(q):
    import torch
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()
    q.put(x.grad.tolist())


def test_torch_without_a_gpu_lets_a_forked_child_run_backward_as_mpviz_does():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("with a GPU torch marks forked children: this checks the CPU-only case")
    import multiprocessing
    a = torch.ones(3, requires_grad=True)
    (a * a).sum().backward()                        # the parent ran autograd first
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_torch_backward_in_forked_child, args=(q,))
    p.start()
    try:
        assert q.get(timeout=30) == [2.0, 2.0, 2.0]
    finally:
        p.join(10)
        q.close()
        q.join_thread()


def test_a_small_dev_shm_fills_and_fewer_workers_or_more_shm_fix_it():
    bad = run("small-shm")                          # 4 workers x 2 x 8 MiB in 64 MiB
    assert bad.outcome == "error" and bad.details["errors"]
    assert "SharedMemoryFullError" in bad.details["errors"][0]
    # 8 MiB + a header each: the 8th does not fit -- or the 7th and 8th were written at the same
    # moment into the last 16 MiB, each took part of it and both failed (seen on 3.13, a real
    # tmpfs), which the explanation must then say
    raced = "at the same moment" in bad.explanation
    assert bad.details["batches"] == (6 if raced else 7), bad.explanation
    assert not raced or len(bad.details["errors"]) >= 2
    assert "--shm-size" in bad.explanation and "workers=2" in bad.explanation
    where = bad.details["where"]
    assert ("real 64 MiB tmpfs" if where == "tmpfs" else "cap") in bad.explanation
    more = run("small-shm", shm_mb=128)
    assert more.outcome == "ok" and more.details["batches"] == 8


def test_a_small_dev_shm_under_mpvizs_own_cap_fails_at_the_same_batch():
    bad = run("small-shm", shm="cap")
    assert bad.outcome == "error" and bad.details["batches"] == 7
    assert "cap of 64 MiB" in bad.details["errors"][0] and "shm='cap'" in bad.explanation
    assert run("small-shm", shm="cap", batch_mb=4).outcome == "ok"


def test_a_worker_past_the_memory_limit_is_sigkilled_and_less_memory_fixes_it():
    bad = run("oom-killed")                         # 3 x 120 MiB against 256 MiB
    assert bad.outcome == "error"
    assert bad.details["raised"] == "ProcessExitedException"
    assert bad.details["exit_code"] == -9 and bad.details["signal_name"] == "SIGKILL"
    assert "terminated with signal SIGKILL" in bad.explanation
    if bad.details["where"] == "cgroup":            # the kernel's own OOM killer did it
        assert bad.details["oom_kills"] >= 1 and bad.details["cgroup_removed"]
        assert "real memory cgroup" in bad.explanation
    killed = [p for p in bad.trace.processes() if p.signal == "SIGKILL"]
    # one, or as many as the kernel's OOM killer took (it may take two), and the verdict says so
    n = bad.details["oom_kills"] if bad.details["where"] == "cgroup" else 1
    assert len(killed) == n
    assert ("one was killed" if n == 1 else f"{n} were killed") in bad.explanation
    samples = [e for e in bad.trace.of_kind("mem.rss") if e.args["of"] == killed[0].pid]
    assert len(samples) >= 3 and samples[-1].args["rss"] > samples[0].args["rss"]  # it grew
    from mpviz.viz.rss import rss_lanes
    ax = rss_lanes(bad.trace).axes[0]
    ends = [t for t in ax.texts if t.get_text().startswith(("SIGKILL (", "SIGTERM ("))]
    assert len(ax.get_lines()) >= 3 and any(t.get_text().startswith("SIGKILL (") for t in ends)
    # The SIGKILL and the SIGTERMs come within ms at nearly the same memory: their labels are
    # set at least one 8-point line apart (in points on the page, not only in MiB).
    heights = sorted(ax.transData.transform((0, t.get_position()[1]))[1] for t in ends)
    line = 8 * ax.figure.dpi / 72
    assert all(b - a >= line for a, b in zip(heights, heights[1:])), heights
    good = run("oom-killed", mb_per_worker=60)
    assert good.outcome == "ok"


def test_without_a_cgroup_the_driver_plays_the_oom_killer_and_says_so():
    bad = run("oom-killed", limit="watchdog")
    assert bad.outcome == "error" and bad.details["killed_by_watchdog"] is not None
    assert bad.details["signal_name"] == "SIGKILL" and "limit='watchdog'" in bad.explanation


def test_a_script_relying_on_fork_breaks_under_forkserver_and_an_explicit_context_fixes_it():
    local = run("forkserver-default")
    assert local.outcome == "error" and local.details["start_method"] == "forkserver"
    # (pickle's words: "Can't pickle local object" up to 3.12, "Can't get local object" since 3.13)
    assert any(f"Can't {verb} local object" in local.details["error"] for verb in ("pickle", "get"))
    state = run("forkserver-default", breaks_on="global-state")
    assert state.outcome == "error" and state.details["exitcode"] == 1
    assert "KeyError: 'lr'" in state.output           # what the verdict says the child died of
    fixed = run("forkserver-default", fix="explicit-context")
    assert fixed.outcome == "ok" and fixed.details["start_method"] == "fork"
    assert fixed.details["got"] == 1.0
    # (fix="spawn-safe", the other fix, runs in notebook 09 under nbval)


def test_mpviz_refuses_a_non_leaf_at_put_and_detach_fixes_it():
    bad = run("non-leaf-put")
    assert bad.outcome == "error" and bad.details["put"].startswith("RuntimeError: Cowardly")
    assert bad.details["consumer_got"] == []
    good = run("non-leaf-put", detach=True)
    assert good.outcome == "ok" and good.details["consumer_got"] == [[2.0, 2.0, 2.0]]


def test_the_stdlib_queue_torch_uses_drops_an_mpviz_non_leaf_the_same_way():
    lost = run("non-leaf-put", library="stdlib")   # no torch needed
    assert lost.details["put"] == "returned" and lost.details["consumer_got"] == []
    assert lost.outcome == "error" and "Cowardly refusing" in lost.output


def test_real_torch_drops_the_non_leaf_silently_in_its_feeder_thread():
    pytest.importorskip("torch")
    lost = run("non-leaf-put", library="torch")
    assert lost.details["put"] == "returned"         # no error where the mistake is ...
    assert lost.details["consumer_got"] == []        # ... and the tensor never arrives
    assert lost.outcome == "error" and "Cowardly refusing" in lost.output


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mount)")
def test_under_the_cap_a_real_small_dev_shm_that_fills_first_is_named_as_such():
    # the whole run inside a 32 MiB /dev/shm: the machine's own runs out before the 64 MiB cap
    code = ("import json, mpviz.scenarios as sc; r = sc.run('small-shm', shm='cap'); "
            "print(json.dumps([r.outcome, r.details['batches'], r.explanation]))")
    out = run_with_small_dev_shm("32m", code, timeout=60)
    outcome, batches, explanation = json.loads(out.stdout.strip().splitlines()[-1])
    assert outcome == "error" and batches in (2, 3)   # 3 x (8 MiB + a page) fit in 32 MiB,
    assert "this machine's own /dev/shm (32 MiB)" in explanation    # one at a time ...
    if batches == 2:        # ... but two workers writing into the last room at once both fail
        assert "at the same moment" in explanation, explanation      # (a busy CI run: 2)


def test_two_batches_written_into_the_last_room_at_once_are_said_to_have_raced():
    # the 3.13 chroot's run: 6 batches in a real 64 MiB tmpfs, two workers failing at once
    from mpviz.scenarios import small_shm
    prm = {"batch_mb": 8}
    details = {"where": "tmpfs", "shm_size": 64 << 20, "batches": 6, "errors": ["a", "b"]}
    said = small_shm._raced(details, prm)
    assert "Room for 7" in said and "2 workers were writing" in said, said
    assert small_shm._raced(dict(details, batches=7, errors=["a"]), prm) == ""
    assert small_shm._raced(dict(details, where="cap"), prm) == ""   # counted under a lock
