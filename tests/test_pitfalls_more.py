"""Pitfall #7 of torch.multiprocessing, the sides too-many-fds leaves out: the *sender's* own
"Too many open files", and "No such file or directory" after /dev/shm is cleaned under a live job.

Each scenario runs on the side that shows the pitfall and on each side of its fix, with real
processes, real fd limits and real unlinks in /dev/shm. Where torch is installed, an oracle test
checks that torch fails the way the verdicts quote it.
"""
import os
import resource

import pytest

import mpviz.scenarios as sc
from test_pitfalls import run

MORE = ["sender-fds", "shm-wiped"]          # pitfall #7; #10 adds its two below


def test_the_scenarios_are_in_the_catalog():
    for name in MORE:
        assert name in sc.names()


def test_a_sender_that_keeps_what_it_sent_runs_out_of_fds_itself():
    bad = run("sender-fds")
    assert bad.outcome == "error"
    assert bad.details["error"].startswith("TooManyFdsError: [Errno 24]")
    assert "creating a shared storage" in bad.details["error"]
    # the consumer dropped everything it got: the sender ran out on its own
    assert bad.details["consumer_got"] == bad.details["sent"] < bad.params["count"]
    assert "Too many open files (24)" in bad.explanation and "keep=False" in bad.explanation
    for fix in ({"keep": False}, {"strategy": "file_system"}):
        good = run("sender-fds", **fix)
        assert good.outcome == "ok", good.explanation
        assert good.details["sent"] == good.details["consumer_got"] == 100
        assert good.details["peak_fds"] < good.params["limit"]


def test_a_cleanup_of_dev_shm_under_a_live_job_breaks_the_next_get():
    bad = run("shm-wiped")
    assert bad.outcome == "error"
    assert bad.details["in_dev_shm"] and bad.details["removed"]
    kind, said = bad.details["get"]
    assert kind == "error" and said.startswith("SegmentGoneError: [Errno 2]")
    assert "No such file or directory (2)" in bad.explanation and "wipe=False" in bad.explanation
    good = run("shm-wiped", wipe=False)
    assert good.outcome == "ok" and good.details["get"] == ["got", [1024]]
    # under file_descriptor the cleanup finds no name: the segment was unlinked when made
    fd = run("shm-wiped", strategy="file_descriptor")
    assert fd.outcome == "ok" and fd.details["removed"] is False
    assert fd.details["in_dev_shm"] is False


def _torch_child_reports(target, *args):
    """Run target(out, *args) in a spawned child of its own; return the one report it puts."""
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    out = ctx.SimpleQueue()
    child = ctx.Process(target=target, args=(out, *args))
    child.start()
    report = out.get()
    child.join()
    out.close()
    return report


def _torch_consume(q, out):
    try:
        t = q.get()
        out.put(("got", list(t.shape)))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _torch_wipe_oracle(report):
    """In a process of its own (torch's file_system strategy starts torch_shm_manager, which
    outlives it by design): share, put, remove the name, and let a consumer get."""
    import torch
    import torch.multiprocessing as tmp
    tmp.set_sharing_strategy("file_system")
    ctx = tmp.get_context("spawn")
    q, out = ctx.SimpleQueue(), ctx.SimpleQueue()
    t = torch.zeros(1024).share_memory_()
    name = t.untyped_storage()._share_filename_cpu_()[1]
    name = name.decode() if isinstance(name, bytes) else name
    q.put(t)
    os.unlink("/dev/shm" + name)                  # the cleanup, of this one name
    child = ctx.Process(target=_torch_consume, args=(q, out))
    child.start()
    report.put(out.get())
    child.join()


def test_torch_says_no_such_file_after_a_cleanup():
    pytest.importorskip("torch")
    kind, said = _torch_child_reports(_torch_wipe_oracle)
    assert kind == "error"
    assert "unable to open shared memory object </torch_" in said
    assert "in read-write mode: No such file or directory (2)" in said


def _torch_keep_sharing(out, limit):
    import torch
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    kept = []
    try:
        for _ in range(200):
            kept.append(torch.zeros(4).share_memory_())
        out.put(("ok", len(kept)))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def test_torch_sender_runs_out_of_fds_as_the_verdict_says():
    pytest.importorskip("torch")
    kind, said = _torch_child_reports(_torch_keep_sharing, 48)
    assert kind == "error"
    assert "unable to open shared memory object </torch_" in said
    assert "in read-write mode: Too many open files (24)" in said


# --- pitfall #10: per-worker optimizer state, and oversubscription ---------------------------

MORE += ["optimizer-state", "oversubscription"]


def test_sgd_share_memory_makes_one_momentum_buffer_that_pickles_by_position():
    import pickle

    import mpviz as torch
    from mpviz import optim
    from mpviz.tensor import Tensor
    w = torch.ones(3, requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9).share_memory()
    buf = opt.state[id(w)]
    assert isinstance(buf, Tensor) and buf.is_shared() and buf.tolist() == [0.0, 0.0, 0.0]
    (w * 2).sum().backward()
    opt.step()                                    # zeros x 0.9 + grad = grad: torch's first step
    assert buf.tolist() == [2.0, 2.0, 2.0] and w.tolist() == pytest.approx([0.8] * 3)
    w2, opt2 = pickle.loads(pickle.dumps((w, opt)))
    assert opt2.param_groups[0]["params"][0] is w2 and id(w2) in opt2.state
    assert opt2.state[id(w2)].tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(TypeError):
        optim.SGD(w, lr=0.1)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_each_worker_has_its_own_momentum_unless_the_optimizer_is_shared(start_method):
    own = run("optimizer-state", start_method=start_method)
    assert own.outcome == "warning" and own.details["parent"] is None
    buffers = list(own.details["workers"].values())
    assert [where for where, _, _ in buffers] == ["private", "private"]
    assert buffers[0][2] != buffers[1][2]
    assert "optimizer.share_memory()" in own.explanation
    one = run("optimizer-state", start_method=start_method, shared_state=True)
    assert one.outcome == "ok", one.explanation
    parent = one.details["parent"]
    assert parent[0] == "shared" and any(parent[2])
    assert {segment for _, segment, _ in one.details["workers"].values()} == {parent[1]}


def test_oversubscription_counts_threads_per_worker_against_the_cores():
    bad = run("oversubscription", workers=2, products=5)
    threads, cores = bad.details["threads"], bad.details["cores"]
    pools = any(n > 1 for n in threads)           # the library's default: a pool per worker
    assert bad.outcome == ("warning" if pools and sum(threads) > cores else "ok"), bad.explanation
    if bad.outcome == "warning":
        assert "oversubscribed" in bad.explanation and "set_num_threads" in bad.explanation
    good = run("oversubscription", workers=2, threads=1, products=5)
    assert good.outcome == "ok" and good.details["threads"] == [1, 1], good.explanation
