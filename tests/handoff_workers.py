"""Children for tests/test_handoff.py (module level, so spawn and forkserver can import them)."""
import os
import threading
import time
import weakref

import mpviz
import mpviz.multiprocessing as mp


def put_many(q, sizes, tag):
    """Put one bytes object per size, each starting with `tag` and its index."""
    for i, n in enumerate(sizes):
        q.put((tag, i, b"x" * n))


def put_from_threads(q, nthreads, n):
    def work(k):
        for i in range(n):
            q.put((k, i))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def joinable_consumer(q, n):
    for _ in range(n):
        q.get()
        q.task_done()


def get_and_exit(q, out, strategy):
    """Receive a tensor we already map (the second copy), then exit straight away."""
    mp.set_sharing_strategy(strategy)
    first = q.get()
    q.get()
    out.put(float(first.sum()))


def echo_dropping(inbox, outbox, strategy, cache_bytes):
    """Send back what arrives and drop it, as bench.handoff.echo does, with the shared-memory
    cache on; report the cache at the end.

    Unlike the bench's echo, it then waits (bounded) until its fd server no longer keeps what it
    offered (file_system keeps nothing while the cache is on): so what serves the next arrival
    of the same memory is the cache, which is what the test looks at."""
    from mpviz.sharing import allocator, fd_passing
    mp.set_sharing_strategy(strategy)
    allocator.enable(cache_bytes)
    while True:
        item = inbox.get()
        if item is None:
            break
        outbox.put(item)
        del item
        deadline = time.monotonic() + 10
        while fd_passing.pending_offers():
            if time.monotonic() > deadline:
                raise RuntimeError("what this child sent is still kept after 10 s")
            time.sleep(0.001)
    outbox.put(allocator.stats())


def put_twice_then_die(q, out):
    """put_then_die with two handles to the same tensor in flight."""
    import signal
    mp.set_sharing_strategy("file_system")
    t = mpviz.full((100,), 7.0).share_memory_()
    witness = mpviz.zeros(1).share_memory_()
    q.put(t)
    q.put(t)
    out.put((t.untyped_storage().segment_name, witness.untyped_storage().segment_name))
    q.close()
    q.join_thread()
    os.kill(os.getpid(), signal.SIGKILL)


def keep_then_die(q, out):
    """Take one tensor and let it go with the shared-memory cache on (the mapping is kept, this
    process's count given back), then die by SIGKILL; report the kept count and a witness.
    (`out` is an mpviz Queue: its small put is in the pipe when put returns.)"""
    import gc
    import signal
    from mpviz.sharing import allocator
    mp.set_sharing_strategy("file_system")
    allocator.enable(1 << 20)
    t = q.get(timeout=30)
    del t
    gc.collect()
    witness = mpviz.zeros(1).share_memory_()
    out.put((allocator.stats()["kept_received"], witness.untyped_storage().segment_name))
    os.kill(os.getpid(), signal.SIGKILL)


def put_then_die(q, out):
    """Share a tensor under file_system, put its handle, die by SIGKILL; report two names first:
    the tensor's, and a witness's — a segment held here and sent nowhere, which the manager
    removes in the same round as it decides about the tensor's (see the test)."""
    import signal
    mp.set_sharing_strategy("file_system")
    t = mpviz.full((100,), 7.0).share_memory_()
    witness = mpviz.zeros(1).share_memory_()
    q.put(t)
    out.put((t.untyped_storage().segment_name, witness.untyped_storage().segment_name))
    q.close()
    q.join_thread()                  # the handle is in the pipe
    os.kill(os.getpid(), signal.SIGKILL)


def add_many(tensor, n, which, go, out):
    """Add 1 to the tensor's shared count `n` times with atomic add `which` ("C" or "ctypes"):
    say "ready", and start when `go` (an Event) is set. Our own hold goes when we exit: what is
    left is exactly what the adds did."""
    from mpviz.sharing import segment
    add = segment.choose_atomic_add(which)
    buf = tensor.untyped_storage()._segment._buf
    out.put("ready")
    if not go.wait(timeout=30):
        raise RuntimeError("never told to go")
    for _ in range(n):
        add(buf, 1)
    out.put("done")


def echo_twice_and_compare(inbox, outbox, strategy):
    """Send back what arrives and drop it; then say whether the Storage was still here (in the
    receive cache) and whether the second arrival of the same memory came back as that object."""
    from mpviz.sharing import cache, file_system
    mp.set_sharing_strategy(strategy)
    file_system.LINGER_SECONDS = 0.5          # so a slow machine's pause cannot end the linger
    x = inbox.get()
    first, key = weakref.ref(x.untyped_storage()), x.untyped_storage()._segment.key
    outbox.put(x)
    del x
    still_here = cache.get(key) is not None and cache.get(key) is first()
    y = inbox.get()
    outbox.put((still_here, y.untyped_storage() is first()))


def reads_with_os_read(q, out):
    """Whether this process's copy of the mpviz Queue `q` reads with its own two-os.read framing
    (_pipe.read_message, set by _reset after fork and unpickling), and what it then reads."""
    from mpviz.multiprocessing import _pipe
    ours = getattr(q._recv_bytes, "func", None) is _pipe.read_message
    out.put((ours, q.get(timeout=10)))


def describe_and_write(q, out, strategy):
    """Report what arrived (the view's layout, its grad flag, its values), then write into it."""
    import mpviz.multiprocessing as mp
    mp.set_sharing_strategy(strategy)
    t = q.get(timeout=30)
    out.put((type(t).__name__, t.shape, t.stride(), t.storage_offset(), str(t.dtype),
             t.requires_grad, t.tolist()))
    t.mul_(-1)
    out.put("written")


def let_go_and_die_halfway(q, out):
    """Put a tensor, then let it go — and die by SIGKILL right after giving our count back,
    before the shm manager hears that we no longer map it."""
    import gc
    import signal
    from mpviz.sharing import file_system
    mp.set_sharing_strategy("file_system")
    t = mpviz.full((100,), 7.0).share_memory_()
    witness = mpviz.zeros(1).share_memory_()
    name = t.untyped_storage().segment_name
    q.put(t)
    real_add = file_system._add_mapped

    def add_then_die(segment, buf, delta, **how):
        count = real_add(segment, buf, delta, **how)
        if segment == name and delta < 0:
            out.put((name, witness.untyped_storage().segment_name, count))
            os.kill(os.getpid(), signal.SIGKILL)
        return count
    file_system._add_mapped = add_then_die
    del t
    gc.collect()


def map_twice_then_die(q, out):
    """Map the same segment twice (the first tensor's Storage dies, its NumPy view keeps the
    mapping, so the receive cache misses the second time), then die by SIGKILL."""
    import gc
    import signal
    mp.set_sharing_strategy("file_system")
    first = q.get(timeout=30).numpy()
    gc.collect()
    second = q.get(timeout=30)
    witness = mpviz.zeros(1).share_memory_()
    first[0] = 5.0                   # two mappings (two addresses) of one memory
    two_views = first.ctypes.data != second.numpy().ctypes.data and second.tolist()[0] == 5.0
    out.put((two_views, witness.untyped_storage().segment_name))
    os.kill(os.getpid(), signal.SIGKILL)


def switch_off_then_exit(q, out):
    """Put a tensor, switch the shm manager off, let the tensor go, and exit without running
    any exit handler (a witness segment is left for the manager to find)."""
    import gc
    from mpviz.sharing import shm_manager
    mp.set_sharing_strategy("file_system")
    t = mpviz.full((100,), 7.0).share_memory_()
    witness = mpviz.zeros(1).share_memory_()
    q.put(t)
    out.put((t.untyped_storage().segment_name, witness.untyped_storage().segment_name))
    shm_manager.enable(False)
    del t
    gc.collect()                     # let go while switched off: the manager must still hear it
    os._exit(0)
