"""The caching allocator reuses a shared segment only when nobody else can see it.

Each test that could go wrong would show up as *another process seeing the next tensor's bytes*:
the child keeps what it got (or a handle is still in the queue), the parent drops its tensor and
shares a new one of the same size filled with something else, and the child must still read its
old bytes — from a segment that is not the parent's new one.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.sharing import allocator

import workers


# -- what the children do (module level, so spawn/forkserver children can import them) --------

def hold_and_report(q, out, done, strategy):
    mp.set_sharing_strategy(strategy)
    t = q.get()
    out.put("holding")
    done.wait(30)
    out.put(t.tolist()[:3])


def receive_and_report(q, out, strategy):
    mp.set_sharing_strategy(strategy)
    out.put(q.get().tolist()[:3])


pytestmark = pytest.mark.timeout(60)

N = 1 << 14  # floats: 64 KiB


@pytest.fixture
def cache_on():
    old = allocator.stats()["budget"]
    allocator.enable(8 << 20)
    yield
    allocator.enable(old)  # 0 again: frees what was kept, so the leak check sees nothing


def key(t):
    return t.untyped_storage()._segment.key


def test_off_by_default_and_switchable():
    assert os.environ.get("MPVIZ_SHM_CACHE_BYTES", "0") == "0" and not allocator.enabled()
    with pytest.raises(ValueError, match="non-negative int"):
        allocator.enable(-1)


def test_a_dropped_segment_comes_back_and_hits_are_counted(strategy, cache_on):
    t = mpviz.ones(N).share_memory_()
    first = key(t)
    del t
    before = allocator.stats()
    u = mpviz.full((N,), 2.0).share_memory_()
    assert key(u) == first                                   # the same memory, reused
    assert allocator.stats()["hits"] == before["hits"] + 1
    assert u.tolist()[:3] == [2.0, 2.0, 2.0]                 # every byte overwritten by share_memory_
    v = mpviz.ones(N + 1).share_memory_()                    # another size: a miss
    assert key(v) != first and allocator.stats()["misses"] == before["misses"] + 1


def test_not_reused_while_a_numpy_view_is_alive(strategy, cache_on):
    t = mpviz.ones(N).share_memory_()
    view = t.numpy()[:10]                                    # outlives the tensor
    first = key(t)
    del t
    u = (mpviz.ones(N) * 3).share_memory_()
    assert key(u) != first and view.tolist() == [1.0] * 10


def test_not_reused_while_a_child_maps_it(ctx, strategy, cache_on):
    q, out, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=hold_and_report, args=(q, out, done, strategy))
    p.start()
    t = mpviz.ones(N)
    q.put(t)
    assert out.get(timeout=30) == "holding"                  # the child maps it now
    first = key(t)
    del t
    u = (mpviz.ones(N) * 5).share_memory_()                  # same size, while the child holds
    assert key(u) != first
    done.set()
    assert out.get(timeout=30) == [1.0, 1.0, 1.0]            # the child still saw its own bytes
    p.join(30)
    assert p.exitcode == 0


def test_not_reused_while_a_handle_is_in_flight(ctx, strategy, cache_on):
    q, out = ctx.Queue(), ctx.Queue()
    t = mpviz.ones(N)
    q.put(t)                                                 # pickled: a handle in the pipe
    first = key(t)
    del t
    u = (mpviz.ones(N) * 7).share_memory_()                  # nobody has received the handle yet
    assert key(u) != first
    p = ctx.Process(target=receive_and_report, args=(q, out, strategy))
    p.start()
    assert out.get(timeout=30) == [1.0, 1.0, 1.0]
    p.join(30)
    assert p.exitcode == 0


def test_reused_after_the_child_let_go(ctx, strategy, cache_on):
    q, back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=workers.echo, args=(q, back, 1, strategy))
    p.start()
    t = mpviz.ones(N)
    q.put(t)
    r = back.get(timeout=30)
    first = key(t)
    p.join(30)                                               # the child has exited: nobody else
    del t, r
    u = (mpviz.ones(N) * 9).share_memory_()
    assert key(u) == first and np.all(u.numpy() == 9)


def test_budget_evicts_the_oldest(strategy):
    allocator.enable(3 * N * 4)
    try:
        tensors = [mpviz.ones(N).share_memory_() for _ in range(5)]
        del tensors
        assert allocator.stats()["entries"] == 3 and allocator.stats()["bytes"] == 3 * N * 4
    finally:
        allocator.enable(0)
    assert allocator.stats()["entries"] == 0


def test_cache_events_are_recorded(strategy, cache_on, tmp_path):
    import mpviz.trace as trace
    with trace.record(tmp_path / "t") as tr:
        a = mpviz.ones(N).share_memory_()
        del a
        b = mpviz.ones(N).share_memory_()
        del b
    hits = [e.args["hit"] for e in tr.events if e.kind == "shm.cache"]
    assert hits == [False, True]


def test_a_script_that_exits_with_the_cache_on_leaves_nothing_in_dev_shm(tmp_path):
    # No segment was ever parked, so the cache's exit hook came late: it must still run before
    # weakref's last finalizers, or they park their segments where nothing frees them (with the
    # shm manager off, the names would stay in /dev/shm).
    tag = os.environ["MPVIZ_SHM_TAG"] + "exit_"  # inside this run's prefix: the leak check sees it
    script = tmp_path / "exit_with_cache.py"
    script.write_text(
        "import mpviz, mpviz.multiprocessing as mp\n"
        "mp.set_sharing_strategy('file_system')\n"
        "t = mpviz.ones(1024).share_memory_()\n"
        "print(t.untyped_storage().segment_name)\n")
    env = dict(os.environ, MPVIZ_SHM_CACHE_BYTES=str(1 << 20), MPVIZ_SHM_MANAGER="0",
               MPVIZ_SHM_TAG=tag, PYTHONPATH=os.path.dirname(os.path.dirname(mpviz.__file__)))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    name = out.strip()
    assert name.startswith("/mpviz_" + tag)
    assert not os.path.exists("/dev/shm" + name), "the segment outlived its only holder"
