"""The fast hand-off — a Queue.put that writes the pipe itself, a receiver that needs no
descriptor for memory it still holds, releases sent together, and kept mappings (cache on)."""
import gc
import os
import signal
import threading
import time
import weakref

import pytest

import mpviz
import mpviz.multiprocessing as mp
import mpviz.trace as mt
from mpviz.multiprocessing import _codec, _pipe
from mpviz.sharing import allocator, cache, fd_passing, file_system, segment

import handoff_workers as hw
from proc_helpers import finish, start

pytestmark = pytest.mark.timeout(60)


# conftest's `strategy` fixture, for file_descriptor alone (it restores the one there was)
fd_only = pytest.mark.parametrize("strategy", ["file_descriptor"], indirect=True)


def _count(tensor):
    """The count in the tensor's segment header (holders + handles in flight). (file_system's
    header word also counts give-backs, in its high 32 bits: shm_manager.split_count.)"""
    word = segment.atomic_add(tensor.untyped_storage()._segment._buf, 0)
    if tensor.untyped_storage()._segment.strategy == "file_system":
        from mpviz.sharing.shm_manager import split_count
        return split_count(word)[0]
    return word


# -- a lone tensor travels as a short handle ---------------------------------------------------

def test_a_lone_tensor_travels_as_a_short_handle_and_arrives_as_the_same_view(strategy):
    base = mpviz.arange(24.0).reshape(4, 6)
    view = base[1:, ::2]                                  # an offset and strides of its own
    data, pickled = _codec.encode(view), _codec.dumps(view)   # two handles in flight
    assert data[:1] == _codec.TENSOR and len(data) < len(pickled)
    assert _codec.decode(pickled).tolist() == view.tolist()
    back = _codec.decode(data)
    assert back.untyped_storage() is base.untyped_storage()   # our own: the receive cache
    assert (back.shape, back.stride(), back.storage_offset()) == ((3, 3), (6, 2), 6)
    assert back.tolist() == view.tolist() and back.dtype == view.dtype
    assert _count(back) == 1                              # both handles' counts given back


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint16", "int64", "bool",
                                   "complex64", ">f4", "<i8"])
def test_every_dtype_survives_the_short_handle(dtype):
    import numpy as np
    t = mpviz.from_numpy((np.arange(6) % 3).astype(dtype))
    data = _codec.encode(t)
    assert data[:1] == _codec.TENSOR
    back = _codec.decode(data)
    assert back.dtype == t.dtype and back.numpy().dtype == np.dtype(dtype)
    assert back.tolist() == t.tolist()


def test_what_the_short_handle_leaves_out_is_pickled():
    from mpviz import nn
    with_grad = mpviz.ones(3, requires_grad=True)
    with_grad.grad = mpviz.zeros(3)
    for obj in (nn.Parameter(mpviz.ones(2)), with_grad, [mpviz.ones(2)], (mpviz.ones(2), 5)):
        data = _codec.encode(obj)
        assert data[:1] == b"\x80"                       # a pickle: protocol 2 and up
        back = _codec.decode(data)
        assert type(back) is type(obj)
    assert _codec.decode(_codec.encode(with_grad)).grad.tolist() == [0.0, 0.0, 0.0]


def test_a_non_leaf_that_requires_grad_is_refused_at_put():
    q = mp.get_context("fork").Queue()
    leaf = mpviz.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        q.put(leaf * 2)
    q.put(leaf)                                           # a leaf that requires grad may go
    assert q.get(timeout=5).requires_grad
    q.close()
    q.join_thread()


def test_a_view_crosses_to_a_child_and_the_child_writes_the_parents_memory(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    base = mpviz.arange(12.0).reshape(3, 4)
    base.share_memory_()
    p = start(ctx, hw.describe_and_write, q, out, strategy)
    q.put(base[1:, 1::2])
    assert out.get(timeout=30) == ("Tensor", (2, 2), (4, 2), 5, "float32", False,
                                   [[5.0, 7.0], [9.0, 11.0]])
    assert out.get(timeout=30) == "written"
    finish(p)
    assert base.tolist() == [[0, 1, 2, 3], [4, -5, 6, -7], [8, -9, 10, -11]]


# -- Queue.put writes small messages itself, and keeps the order ---------------------------------

def test_small_puts_skip_the_feeder_thread():
    q = mp.get_context("fork").Queue()
    for i in range(100):
        q.put(i)
    assert q._thread is None                      # every message was written by put itself
    assert [q.get(timeout=5) for _ in range(100)] == list(range(100))


def test_get_reads_with_two_os_reads_here_and_in_a_child(ctx):
    # The stdlib's get would work too (through Connection.recv_bytes), just slower: so check
    # the read is ours, in this process and in a child (forked, spawned: _reset sets it).
    q, out = ctx.Queue(), ctx.Queue()
    assert q._recv_bytes.func is _pipe.read_message
    p = start(ctx, hw.reads_with_os_read, q, out)
    q.put("hello")
    assert out.get(timeout=30) == (True, "hello")
    finish(p)


def test_a_large_put_goes_through_the_feeder_and_later_small_ones_wait_their_turn(ctx):
    # 200 KiB does not fit in a 64 KiB pipe: it takes the feeder; the small puts behind it must
    # not overtake it while it is still being written.
    q = ctx.Queue()
    sizes = [10, 200_000, 10, 10, 70_000, 10]
    p = start(ctx, hw.put_many, q, sizes, "a")
    got = [q.get(timeout=30) for _ in sizes]
    finish(p)
    assert [(tag, i, len(b)) for tag, i, b in got] == [("a", i, n) for i, n in enumerate(sizes)]


def test_two_producers_each_keep_their_order(ctx):
    q = ctx.Queue()
    sizes = [5, 90_000, 5, 5, 5, 30_000, 5, 5] * 3
    ps = [start(ctx, hw.put_many, q, sizes, tag) for tag in "ab"]
    got = [q.get(timeout=30) for _ in range(2 * len(sizes))]
    finish(*ps)
    for tag in "ab":
        assert [i for t, i, _ in got if t == tag] == list(range(len(sizes)))


def test_threads_putting_at_once_lose_nothing():
    q = mp.get_context("fork").Queue()
    hw.put_from_threads(q, 4, 500)
    got = [q.get(timeout=10) for _ in range(2000)]
    for k in range(4):
        assert [i for kk, i in got if kk == k] == list(range(500))


def test_a_full_queue_raises_full_and_an_unpicklable_item_frees_its_slot():
    import queue as stdlib_queue
    q = mp.get_context("fork").Queue(maxsize=2)
    q.put(1)
    with pytest.raises(TypeError):
        q.put(threading.Lock())                   # refused in put: its slot is given back
    q.put(2, timeout=1)                           # Full here would mean the slot was lost
    with pytest.raises(stdlib_queue.Full):
        q.put(3, timeout=0.1)
    assert [q.get(timeout=5), q.get(timeout=5)] == [1, 2]


def test_joinable_queue_counts_tasks_put_directly(ctx):
    q = ctx.JoinableQueue()
    for i in range(50):
        q.put(i)
    p = start(ctx, hw.joinable_consumer, q, 50)
    q.join()                                      # returns: 50 task_done for 50 puts
    finish(p)


# -- a receiver that still holds the memory needs no descriptor ---------------------------------

def test_a_consumer_that_sends_back_and_drops_finds_the_same_storage_next_time(
        ctx, strategy, monkeypatch):
    # q_out.put(q_in.get()): the consumer drops its tensor right after the put. It keeps the
    # Storage a moment (fd server offer until our release arrives / file_system linger), so the
    # same memory arriving again finds that very object: no descriptor, no mapping.
    # Our release of the child's offer waits 0.5 s, not 5 ms: late enough, even on a slow machine.
    monkeypatch.setattr(fd_passing, "RELEASE_DELAY", 0.5)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    t = mpviz.ones(16)
    p = start(ctx, hw.echo_twice_and_compare, inbox, outbox, strategy)
    inbox.put(t)
    back = outbox.get(timeout=30)
    assert back.untyped_storage() is t.untyped_storage()
    del back
    inbox.put(t)
    assert outbox.get(timeout=30) == (True, True)
    finish(p)


@fd_only
def test_an_offered_storage_is_kept_until_released(strategy):
    # The same in one process, under file_descriptor: the fd server's offer holds the Storage
    # until the handle comes back to us (a release to ourselves: the offer is dropped).
    t = mpviz.arange(4.0)
    data = _codec.dumps(t)                       # sent: the offer keeps the Storage
    first = weakref.ref(t.untyped_storage())
    key = t.untyped_storage()._segment.key
    del t
    kept = cache.get(key)
    assert kept is not None and kept is first()
    fds_before = fd_passing.pending_offers()
    back = _codec.decode(data)
    assert back.untyped_storage() is kept and back.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert fd_passing.pending_offers() == fds_before - 1   # our own offer, dropped
    assert _count(back) == 1                      # the handle's count was given back


@fd_only
def test_releases_reach_the_sender_and_a_child_flushes_them_at_exit(ctx, strategy):
    q, out = ctx.Queue(), ctx.Queue()
    t = mpviz.ones(16)
    p = start(ctx, hw.get_and_exit, q, out, "file_descriptor")
    q.put(t)
    q.put(t)                                      # the child maps it already: a release
    assert out.get(timeout=30) == 16.0
    finish(p)
    deadline = time.monotonic() + 5
    while fd_passing.pending_offers() and time.monotonic() < deadline:
        time.sleep(0.01)                          # the release is asynchronous: bounded poll
    assert fd_passing.pending_offers() == 0
    assert _count(t) == 1                         # only we hold it again


def test_kept_mappings_serve_a_consumer_that_drops_each_tensor(ctx, strategy):
    with mt.record() as trace:
        inbox, outbox = ctx.Queue(), ctx.Queue()
        t = mpviz.ones(1024)
        p = start(ctx, hw.echo_dropping, inbox, outbox, strategy, 1 << 20)
        trips = 30
        for _ in range(trips):
            inbox.put(t)
            back = outbox.get(timeout=30)
            assert back.untyped_storage() is t.untyped_storage()
            del back                              # (the child waits until it no longer keeps
                                                  # what it sent: the cache serves the next)
        inbox.put(None)
        stats = outbox.get(timeout=30)
        finish(p)
    # Every arrival after the first found the memory still mapped in the child, kept by the
    # cache. So the child mapped it once:
    mapped = [e for e in trace.events if e.pid == p.pid and e.kind == "shm.attach"
              and not e.args.get("kept") and e.args.get("how") != "fork"]   # (not inherited:
    # a stdlib heap arena this test process made earlier, e.g. a Barrier's, reaches a forked
    # child mapped already, and is recorded there as such)
    assert len(mapped) == 1, [(e.kind, e.args) for e in mapped]
    assert stats["received_hits"] >= 10, stats
    assert stats["received_hits"] == trips - 1, stats    # every arrival after the first
    deadline = time.monotonic() + 5
    while _count(t) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _count(t) == 1                         # the child let go of everything at exit


def test_a_kept_mapping_nobody_else_holds_is_let_go():
    from mpviz.storage import Storage
    budget = allocator.stats()["budget"]          # (MPVIZ_SHM_CACHE_BYTES may have set one)
    allocator.enable(1 << 20)
    try:
        t = mpviz.ones(256)
        t.untyped_storage().share_memory_("file_system")
        seg = t.untyped_storage()._segment
        seg.incref()                              # a handle, as a put would count it ...
        received = Storage(_segment=file_system.attach(seg.name, seg.nbytes))  # ... taken over
        assert _count(t) == 2
        del received
        gc.collect()                              # let go, but kept mapped: count ourselves out
        assert allocator.stats()["kept_received"] == 1 and _count(t) == 1
        seg.decref()                              # as if the producer let go: the name is gone
        assert file_system.refcount(seg.name) is None
        allocator.enable(1 << 20)                 # any later visit lets the orphan go
        assert allocator.stats()["kept_received"] == 0
        seg.incref()                              # (t's own count back, for its own release)
    finally:
        allocator.enable(budget)


def _wait_until_removed(path):
    deadline = time.monotonic() + 5
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)                          # an OS fact: bounded poll
    return not os.path.exists(path)


def _run_and_hear(ctx, worker, q=None, exitcode=-signal.SIGKILL):
    """Run `worker(q, out)` in a child to its end (killed, by default); return q and its report."""
    q, out = q or ctx.Queue(), ctx.Queue()
    p = start(ctx, worker, q, out)
    report = out.get(timeout=30)
    p.join(30)
    assert p.exitcode == exitcode, f"{worker.__name__} ended with {p.exitcode}"
    return q, report


def _sevens_arrive_then_go(q, name):
    """The handle still in `q` finds its memory (a dead sender's 100 sevens); once we let go,
    the name is removed (by our own count reaching 0, or by the manager)."""
    t = q.get(timeout=30)
    assert t.tolist() == [7.0] * 100
    del t
    gc.collect()
    assert _wait_until_removed("/dev/shm" + name), "the name outlived every holder"


def test_a_handle_in_flight_outlives_its_killed_sender(start_method):
    # The shm manager sees the sender die holding the segment. It must not remove the name: the
    # segment's header still counts the handle on its way (2, less 1 for the dead sender).
    ctx = mp.get_context(start_method)
    q, out = ctx.Queue(), ctx.SimpleQueue()
    p = start(ctx, hw.put_then_die, q, out)
    name, witness = out.get()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    # Wait for the manager to handle the death: the witness, held only by the sender, is removed
    # in the same round (both names were the dead sender's) as the manager decides about `name`.
    assert _wait_until_removed("/dev/shm" + witness), "the manager never handled the death"
    assert os.path.exists("/dev/shm" + name)
    _sevens_arrive_then_go(q, name)               # only the dead sender's 1 left: the manager's
    out.close()


def test_a_mapping_the_cache_keeps_is_not_counted_for_its_killed_holder(start_method):
    # Two handles in flight, their sender killed: its 1 stays in the header for ever (count 3).
    # A keeper takes one (its count replaces the handle's), lets it go into the shared-memory
    # cache (count 2: its own given back, the mapping kept), and is killed too. The manager must
    # not count the keeper's hold as a count that died with it: 2 - 1 dead = 1 handle in flight.
    ctx = mp.get_context(start_method)
    q, (name, witness) = _run_and_hear(ctx, hw.put_twice_then_die)
    _, (kept, keeper_witness) = _run_and_hear(ctx, hw.keep_then_die, q)
    assert kept == 1
    assert _wait_until_removed("/dev/shm" + witness), "the manager never handled the sender's death"
    assert _wait_until_removed("/dev/shm" + keeper_witness), "... nor the keeper's"
    assert file_system.refcount(name) == 2        # the dead sender's 1 and the second handle
    _sevens_arrive_then_go(q, name)


def test_a_sender_killed_while_letting_go_does_not_lose_the_handle_in_flight(start_method):
    # Killed after giving its count back, before telling the manager it maps the name no more:
    # the manager must not take the count that is left (the handle's) for the dead sender's.
    q, (name, witness, count) = _run_and_hear(mp.get_context(start_method),
                                              hw.let_go_and_die_halfway)
    assert count == 1                             # the handle's
    assert _wait_until_removed("/dev/shm" + witness), "the manager never handled the death"
    _sevens_arrive_then_go(q, name)


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)
def test_a_process_that_maps_a_name_twice_leaves_two_counts_when_killed(start_method, strategy):
    ctx = mp.get_context(start_method)
    q, out = ctx.Queue(), ctx.Queue()
    p = start(ctx, hw.map_twice_then_die, q, out)
    t = mpviz.full((10,), 3.0).share_memory_()   # made after the fork: the child maps it by name
    name = t.untyped_storage().segment_name
    q.put(t)
    q.put(t)
    two_mappings, witness = out.get(timeout=30)
    p.join(30)
    assert two_mappings
    assert _wait_until_removed("/dev/shm" + witness), "the manager never handled the death"
    assert file_system.refcount(name) == 3        # ours and the dead child's two mappings
    del t
    gc.collect()                                  # 2 left, both the dead child's: removed
    assert _wait_until_removed("/dev/shm" + name), "the manager left the dead child's segment"


def test_switching_the_manager_off_after_holding_keeps_it_right(start_method):
    # The sender switched the manager off, then let go of its tensor, then exited without exit
    # handlers. Had the manager not heard the let-go, it would count the handle's count as the
    # dead sender's and remove the name before we read it.
    q, (name, witness) = _run_and_hear(mp.get_context(start_method), hw.switch_off_then_exit,
                                       exitcode=0)
    assert _wait_until_removed("/dev/shm" + witness), "the manager never saw the sender go"
    _sevens_arrive_then_go(q, name)


# -- the shared count: one atomic add, from C or through ctypes ------------------------------------

@pytest.mark.parametrize("which", ["C", "ctypes"])
def test_the_count_is_exact_when_processes_add_at_once(ctx, which):
    # Two processes and this one add to the same count 200,000 times each, starting together
    # (a spawned child is ready ~0.3 s after this one: all wait for `go`): an add that was not
    # atomic across processes would lose some of them.
    try:
        add = segment.choose_atomic_add(which)
    except RuntimeError as e:
        pytest.skip(str(e))
    t = mpviz.zeros(4).share_memory_()
    out = ctx.Queue()
    before = _count(t)
    n = 200_000
    go = ctx.Event()
    children = [start(ctx, hw.add_many, t, n, which, go, out) for _ in range(2)]
    buf = t.untyped_storage()._segment._buf
    assert [out.get(timeout=30) for _ in children] == ["ready", "ready"]
    go.set()
    try:
        for _ in range(n):
            add(buf, 1)
        assert [out.get(timeout=30) for _ in children] == ["done", "done"]
        for p in children:
            finish(p)
        # The children let go of their own holds when they exited (their exit hooks run before
        # join returns): only the adds are left.
        assert _count(t) == before + 3 * n
    finally:
        add(buf, before - _count(t))              # give the count back, so the segment is freed
