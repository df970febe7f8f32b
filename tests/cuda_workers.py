"""Processes the CUDA conformance tests start (importable, so spawn children can find them).

Each worker reports what it saw on an `out` queue as plain Python values, so the test process
asserts on facts, never on timing. Synchronisation is always by Event or queue, never by sleep.
"""
import mpviz
import mpviz.cuda
import mpviz.multiprocessing as mp  # noqa: F401 - registers the reducers in spawned children


def block_info(t):
    info = mpviz.cuda.ipc_info(t)
    return {k: info.get(k) for k in ("block", "role", "refcount", "valid", "producer")}


def consume(q, out, release, done=None):
    """Get a CUDA tensor, report it, hold it until `release` is set, then let go and report."""
    x = q.get()
    out.put(("got", x.is_cuda, str(x.device), x.sum().item(), block_info(x)))
    release.wait()
    del x
    out.put(("released", mpviz.cuda.memory_stats()["received"]))
    if done is not None:
        done.wait()


def consume_twice(q, out):
    """Get two handles to one block: one mapping, one count (the receive cache)."""
    a, b = q.get(), q.get()
    out.put(("same storage", a.untyped_storage() is b.untyped_storage(), block_info(a)["refcount"]))


_kept = []


def consume_and_keep(q, out, finish):
    """Get a CUDA tensor and keep it until this process exits (the 'release late' case)."""
    x = q.get()
    out.put(("got", x.sum().item(), block_info(x)))
    _kept.append(x)  # never del'd: only this process's exit gives the count back
    finish.wait()


def produce(q, got, dtype="float32"):
    """Put a CUDA tensor of ones, wait until the consumer has it, then exit (rule: warning)."""
    x = mpviz.ones(4, 4, dtype=dtype).cuda()
    q.put(x)
    got.wait()


def produce_and_wait(q, done):
    """Best practice 2: put, then keep running until the consumer says it is done."""
    x = mpviz.ones(4, 4).cuda()
    q.put(x)
    done.wait()


def relay(q, q2, out, done):
    """Best practice 3: a received CUDA tensor is refused on q2; its clone travels."""
    x = q.get()
    try:
        q2.put(x)
        out.put(("resent", None))
    except RuntimeError as e:
        out.put(("refused", type(e).__name__, str(e)))
    x_clone = x.clone()
    del x
    q2.put(x_clone)
    done.wait()  # we are x_clone's producer now: stay alive until it is released


def same_queue(out):
    """One process puts and gets its own CUDA tensor on one queue."""
    q = mp.Queue()
    t = mpviz.ones(3).cuda()
    q.put(t)
    try:
        q.get(timeout=30)
        out.put(("ok", None))
    except RuntimeError as e:
        out.put((type(e).__name__, str(e)))
    out.put(("stats", mpviz.cuda.memory_stats()["allocated"]))


def cuda_in_child(out):
    """Try to use CUDA (used by the fork test)."""
    try:
        mpviz.ones(2).cuda()
        out.put(("ok", None))
    except RuntimeError as e:
        out.put((type(e).__name__, str(e)))
