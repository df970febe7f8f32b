"""Tensors whose storages move into shared memory, under every start method and strategy."""
import os
import pickle
import signal
import time

import numpy as np
import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.errors import ProducerExitedError, SegmentGoneError, SharedMemoryFullError, SharingError
from mpviz.sharing import cache, file_system, shm_manager

import workers
from proc_helpers import finish, start

pytestmark = pytest.mark.timeout(60)


# -- the tensor side, in one process ------------------------------------------------------------

def test_share_memory_moves_storage_in_place_for_every_view(strategy):
    t = mpviz.arange(12.0).reshape(3, 4)
    before = t[1:, ::2]                     # a view made before sharing
    storage = t.untyped_storage()
    old_ptr = storage.data_ptr()
    assert not t.is_shared() and storage.location == "heap"
    assert t.share_memory_() is t
    after = t[:, 1]                         # a view made after
    assert t.is_shared() and before.is_shared() and after.is_shared()
    assert storage.location == strategy and t.untyped_storage() is storage
    assert storage.data_ptr() != old_ptr    # new bytes, same Storage object
    t.fill_(7.0)
    assert before.tolist() == [[7.0, 7.0], [7.0, 7.0]] and after.tolist() == [7.0, 7.0, 7.0]
    assert t.share_memory_() is t and storage.data_ptr() == t.untyped_storage().data_ptr()


def test_views_share_storage_and_numpy_is_zero_copy():
    t = mpviz.zeros(4, 4)
    v = t[1:3, ::2]
    assert v.untyped_storage() is t.untyped_storage()
    assert (v.storage_offset(), v.stride(), tuple(v.shape)) == (4, (4, 2), (2, 2))
    v.fill_(1.0)
    assert t.numpy()[1].tolist() == [1.0, 0.0, 1.0, 0.0]
    t.numpy()[0, 0] = 9
    assert t[0, 0].item() == 9
    copy = t[[0, 1]]                         # advanced indexing copies, as in NumPy and torch
    assert copy.untyped_storage() is not t.untyped_storage()


def test_plain_pickle_copies_bytes_and_forking_pickler_sends_a_handle(strategy):
    from multiprocessing.reduction import ForkingPickler
    t = mpviz.zeros(1000)
    assert not t.is_shared()
    blob = pickle.dumps(t)
    assert len(blob) > 4000 and not t.is_shared()            # plain pickle: a copy
    handle = bytes(ForkingPickler.dumps(t))
    assert len(handle) < 600 and t.is_shared()                # ForkingPickler: shared, a handle
    back = ForkingPickler.loads(handle)                       # same process: the very same storage
    assert back.untyped_storage() is t.untyped_storage()


def test_queue_put_shares_before_it_returns(strategy):
    q = mp.Queue()
    mat = mpviz.randn(200, 200)
    assert mat.is_shared() is False
    q.put(mat)
    assert mat.is_shared() is True             # torch: still False here (its feeder thread is late)
    got = q.get(timeout=10)
    assert got.untyped_storage() is mat.untyped_storage()
    q.close()
    q.join_thread()


def test_pickling_errors_reach_the_caller_of_put():
    q = mp.Queue()
    w = mpviz.ones(3, requires_grad=True)
    non_leaf = w * 2
    non_leaf._grad_fn = non_leaf._grad_fn or object()   # a result of an op on a grad-requiring leaf
    non_leaf.requires_grad = True
    with pytest.raises(RuntimeError, match="Cowardly refusing.*detach"):
        q.put(non_leaf)
    q.close()
    q.join_thread()


# -- real processes: every start method x every strategy ----------------------------------------

def test_child_write_is_seen_by_parent(ctx, strategy):
    t = mpviz.zeros(5).share_memory_()
    p = start(ctx, workers.fill, t, 3.0)
    finish(p)
    assert t.tolist() == [3.0] * 5


def test_child_write_through_queue_is_seen_by_parent(ctx, strategy):
    q = ctx.Queue()
    t = mpviz.zeros(6)
    p = start(ctx, workers.fill_from_queue, q, 4.0, strategy)
    q.put(t)
    finish(p)
    assert t.tolist() == [4.0] * 6


def test_fork_without_sharing_is_copy_on_write():
    ctx = mp.get_context("fork")
    t = mpviz.zeros(4)
    p = start(ctx, workers.fill, t, 7.0)
    finish(p)
    assert t.tolist() == [0.0] * 4 and not t.is_shared()


def test_views_arrive_as_views_of_one_storage(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    x = mpviz.arange(20.0).reshape(4, 5)
    p = start(ctx, workers.describe_views, q, out)
    q.put([x, x[2], x[:, 1], x[1:3, ::2]])
    report = out.get(timeout=30)
    finish(p)
    assert report["same_storage"] == [True, True, True, True]
    assert report["offsets"] == [0, 10, 1, 5]
    assert report["strides"] == [(5, 1), (1,), (5,), (5, 2)]
    assert report["values"][3] == [[5.0, 7.0, 9.0], [10.0, 12.0, 14.0]]


def test_receive_cache_returns_the_same_storage(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    t = mpviz.ones(8)
    p = start(ctx, workers.receive_twice, q, out)
    q.put(t)
    q.put(t)
    same_storage, same_tensor = out.get(timeout=30)
    finish(p)
    assert same_storage and not same_tensor     # two tensors, one storage (torch: same data_ptr)


def test_a_buffer_sent_back_is_the_same_object(ctx, strategy):
    inbox, outbox = ctx.Queue(), ctx.Queue()
    t = mpviz.zeros(1024)
    p = start(ctx, workers.echo, inbox, outbox, 3, strategy)
    for _ in range(3):
        inbox.put(t)
        back = outbox.get(timeout=30)
        assert back.untyped_storage() is t.untyped_storage()
    finish(p)


def test_grad_travels_and_is_shared_when_set(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    t = mpviz.zeros(3, requires_grad=True)
    t.grad = mpviz.zeros(3)
    p = start(ctx, workers.grad_child, q, out)
    q.put(t)
    had, shared = out.get(timeout=30)
    finish(p)
    assert had and shared
    assert t.grad.tolist() == [5.0, 5.0, 5.0]   # the child's write to grad is ours too


def test_grad_made_in_the_receiver_stays_there(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    t = mpviz.zeros(3, requires_grad=True)
    p = start(ctx, workers.grad_child, q, out)
    q.put(t)
    had, shared = out.get(timeout=30)
    finish(p)
    assert not had and not shared
    assert t.grad is None


def test_producer_exit_before_get(ctx, strategy):
    q = ctx.Queue()
    p = start(ctx, workers.produce_then_exit, q, strategy, 2)
    finish(p)                                   # the producer is gone before we unpickle
    if strategy == "file_descriptor":
        with pytest.raises(ProducerExitedError, match=r"has exited.*file_system") as info:
            q.get(timeout=30)
        assert isinstance(info.value, ConnectionRefusedError) and info.value.pid == p.pid
        with pytest.raises(ProducerExitedError):
            q.get(timeout=30)
    else:
        assert q.get(timeout=30).tolist() == [0.0] * 4    # a name outlives its creator
        assert q.get(timeout=30).tolist() == [1.0] * 4


def test_file_system_names_appear_in_dev_shm_and_vanish():
    mp.set_sharing_strategy("file_system")
    try:
        t = mpviz.zeros(100).share_memory_()
        name = t.untyped_storage().segment_name
        path = "/dev/shm" + name
        assert os.path.exists(path) and oct(os.stat(path).st_mode & 0o777) == "0o600"
        assert file_system.refcount(name) == 1
        view = t[10:20]
        del t
        assert os.path.exists(path)             # a view keeps the storage alive
        del view
        assert not os.path.exists(path)
    finally:
        mp.set_sharing_strategy("file_descriptor")


def test_file_descriptor_leaves_nothing_in_dev_shm():
    t = mpviz.zeros(100).share_memory_()
    assert t.untyped_storage().location == "file_descriptor"
    name = t.untyped_storage().segment_name
    assert not os.path.exists("/dev/shm" + name)          # unlinked at once: nothing to leak
    fd_links = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")]
    assert any("mpviz_fd_" in link and "(deleted)" in link for link in fd_links)


@pytest.mark.parametrize("manager", [True, False], ids=["manager-on", "manager-off"])
def test_manager_cleans_up_after_a_sigkilled_holder(start_method, manager):
    ctx = mp.get_context(start_method)
    shm_manager.enable(manager)
    try:
        out = ctx.SimpleQueue()
        p = start(ctx, workers.create_and_die, "file_system", out)
        name = out.get()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        path = "/dev/shm" + name
        # The manager removes it as soon as the holder's connection closes (milliseconds): allow
        # it 3 s; without the manager, 1 s -- many times what the manager needs -- shows it stays.
        deadline = time.monotonic() + (3 if manager else 1)
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        if manager:
            assert not os.path.exists(path), "the manager did not remove the dead holder's segment in 3 s"
        else:
            assert os.path.exists(path), "without the manager a SIGKILL leaks the segment"
            os.unlink(path)                     # clean up by hand, as a user would have to
        out.close()
    finally:
        shm_manager.enable(True)


# -- bad input: what, why, how to fix ---------------------------------------------------------------

def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'bogus'.*file_descriptor.*file_system"):
        mp.set_sharing_strategy("bogus")
    with pytest.raises(TypeError, match="must be a str"):
        mp.set_sharing_strategy(None)
    assert mp.get_sharing_strategy() == "file_descriptor"
    assert mp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}


@pytest.mark.parametrize("data", [np.array(["a", "b"]), np.array([object(), 1], dtype=object)])
def test_object_and_string_dtypes_are_refused(data):
    with pytest.raises(TypeError, match="numbers only.*pointers"):
        mpviz.from_numpy(data)
    with pytest.raises(TypeError, match="numbers only"):
        mpviz.tensor(data)


def test_resizing_a_shared_storage_is_refused(strategy):
    t = mpviz.zeros(10)
    t.untyped_storage().resize_(80)             # private: fine
    t.share_memory_()
    with pytest.raises(SharingError, match="cannot resize a shared storage.*segfault"):
        t.untyped_storage().resize_(8)


def test_dev_shm_too_small_says_how_to_grow_it(strategy):
    # A petabyte: more than any /dev/shm has. fallocate refuses at once, nothing is touched.
    with pytest.raises(SharedMemoryFullError, match="shm-size") as info:
        mpviz.sharing.allocate(1 << 50, strategy)
    assert info.value.errno == 28 and info.value.strategy == strategy


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)  # (restored afterwards)
def test_segment_removed_under_a_handle(strategy):
    from multiprocessing.reduction import ForkingPickler
    t = mpviz.zeros(10)
    handle = bytes(ForkingPickler.dumps(t))
    name, key = t.untyped_storage().segment_name, t.untyped_storage()._segment.key
    del t
    assert cache.get(key) is None           # as in a process that never mapped it
    os.unlink("/dev/shm" + name)            # someone "cleans" /dev/shm
    with pytest.raises(SegmentGoneError, match="no longer exists"):
        ForkingPickler.loads(handle)


def test_out_of_fds_under_file_descriptor_says_what_to_do(start_method):
    ctx = mp.get_context(start_method)
    q, out = ctx.Queue(), ctx.Queue()
    count = 120
    p = start(ctx, workers.hold_many, q, out, 64, count)
    tensors = [mpviz.zeros(4) for _ in range(count)]
    for t in tensors:
        q.put(t)
    status, received, message = out.get(timeout=30)
    finish(p)
    assert status == "error" and 20 < received < 64
    assert "TooManyFdsError" in message and "ulimit -n" in message and "file_system" in message


def test_file_system_holds_many_under_the_same_low_limit(start_method):
    ctx = mp.get_context(start_method)
    q, out = ctx.Queue(), ctx.Queue()
    count = 120
    p = start(ctx, workers.hold_many, q, out, 64, count, "file_system")
    mp.set_sharing_strategy("file_system")
    try:
        tensors = [mpviz.zeros(4) for _ in range(count)]
        for t in tensors:
            q.put(t)
        assert out.get(timeout=30) == ("ok", count, None)
        finish(p)
    finally:
        mp.set_sharing_strategy("file_descriptor")


def test_a_forked_child_does_not_keep_its_parents_fd_server_alive():
    # The parent P of a forked child C shares a tensor, then exits. C is still alive (it holds a
    # copy of everything P had). A receiver must get "producer exited", not hang on P's listener.
    fork = mp.get_context("fork")
    q = fork.Queue()
    release = fork.Event()
    grandchild_started = fork.Event()
    p = start(fork, workers.fork_then_put, q, release, grandchild_started)
    grandchild_started.wait(30)
    # P is exiting; its forked child C lives on. (p.join() would wait for C too: C inherited the
    # pipe whose closing tells us P is done. Ask the kernel instead: waitpid, via p.exitcode.)
    deadline = time.monotonic() + 30
    while p.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.exitcode == 0
    with pytest.raises(ProducerExitedError):
        q.get(timeout=30)
    release.set()


def test_a_shm_tag_that_cannot_be_part_of_a_name_is_refused_with_the_reason():
    import subprocess
    import sys
    env = dict(os.environ, MPVIZ_SHM_TAG="my run/1 ")
    out = subprocess.run([sys.executable, "-c", "import mpviz"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode != 0
    assert "MPVIZ_SHM_TAG='my run/1 '" in out.stderr and "letters, digits and _-." in out.stderr
