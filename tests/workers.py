"""Functions that test processes run. They live in a module so that spawn/forkserver children
can import them (a function defined inside a test could not be pickled by reference)."""
import os
import resource
import signal

import mpviz
import mpviz.multiprocessing as mp


def use_strategy(strategy):
    if strategy is not None:
        mp.set_sharing_strategy(strategy)


def fill(tensor, value, done=None):
    tensor.fill_(value)
    if done is not None:
        done.set()


def fill_from_queue(q, value, strategy=None):
    use_strategy(strategy)
    t = q.get()
    t.fill_(value)


def echo(inbox, outbox, n=1, strategy=None):
    """Send back what arrives, n times (the receive cache makes each a handle, not a copy)."""
    use_strategy(strategy)
    for _ in range(n):
        outbox.put(inbox.get())


def describe_views(q, out):
    """Receive [base, views...] and report how they relate to one another."""
    items = q.get()
    base = items[0]
    out.put({
        "same_storage": [t.untyped_storage() is base.untyped_storage() for t in items],
        "offsets": [t.storage_offset() for t in items],
        "strides": [t.stride() for t in items],
        "shapes": [tuple(t.shape) for t in items],
        "values": [t.tolist() for t in items],
    })


def receive_twice(q, out):
    a = q.get()
    b = q.get()
    out.put((a.untyped_storage() is b.untyped_storage(), a is b))


def grad_child(q, out):
    """Receive a tensor; write into its grad if it has one, else make a local grad."""
    t = q.get()
    if t.grad is not None:
        had = True
        t.grad.fill_(5.0)
        shared = t.grad.is_shared()
    else:
        had = False
        t.grad = mpviz.ones(*t.shape)
        shared = t.grad.is_shared()
    out.put((had, shared))


def produce_then_exit(q, strategy=None, n=2):
    use_strategy(strategy)
    for i in range(n):
        q.put(mpviz.full((4,), float(i)))


def create_and_die(strategy, out):
    """Create a shared segment, report its name, then die by SIGKILL (no destructors run)."""
    use_strategy(strategy)
    t = mpviz.zeros(1000).share_memory_()
    out.put(t.untyped_storage().segment_name)
    os.kill(os.getpid(), signal.SIGKILL)


def hold_many(q, out, limit, count, strategy=None):
    """Receive `count` tensors and keep them all, under a low fd limit; report what happened."""
    use_strategy(strategy)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    kept = []
    try:
        for _ in range(count):
            kept.append(q.get())
        out.put(("ok", len(kept), None))
    except OSError as e:
        received = len(kept)
        out.put(("error", received, f"{type(e).__name__}: {e}"))
        del kept[:]  # give the descriptors back, then drain what is left
        for _ in range(count - received - 1):
            try:
                q.get()
            except OSError:
                pass


def add_one(x):
    return x + 1


def square_tensor(t):
    return t * t


def fill_index(t, i):
    t[i] = i
    return i


# -- spawn ------------------------------------------------------------------------------------

def rank_noop(i):
    pass


def rank_fill(i, t):
    t[i] = i + 1


def rank_raise_if(i, bad, gate=None):
    if i == bad:
        raise ValueError(f"boom from {i}")
    if gate is not None:
        gate.wait(60)  # siblings wait, so that only the failing rank can end the run


def rank_exit(i, code):
    if i == 0:
        import sys
        sys.exit(code)


def rank_kill_self(i, which):
    if i == which:
        os.kill(os.getpid(), signal.SIGKILL)
    import time
    time.sleep(60)


def rank_wait(i, event):
    event.wait(60)


def rank_ready_then_wait(i, ready, event):
    """Say it runs (its arguments unpickled, fn called), then wait."""
    ready.set()
    event.wait(60)


def rank_ignore_sigterm(i, ready):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if i == 0:
        ready.wait(60)
        raise RuntimeError("rank 0 fails while rank 1 ignores SIGTERM")
    ready.set()
    import time
    time.sleep(60)


def rank_keyboard_interrupt(i):
    raise KeyboardInterrupt


# -- Pool, as the tutorial times it ---------------------------------------------------------------

UNIT = 0.15  # seconds standing in for the tutorial's 2 s of work


def slow_identity(x):
    import time
    time.sleep(UNIT)
    return x


def slow_add(x, y):
    import time
    time.sleep(UNIT)
    return x + y


def fork_then_put(q, release, started):
    """Share a tensor (starting this process's fd server), fork a child that outlives us, put."""
    q.put(mpviz.ones(3))         # pickling it starts our fd server; the handle waits in q
    q.close()
    q.join_thread()
    mp.get_context("fork").Process(target=_linger, args=(release, started)).start()
    started.wait(30)
    os._exit(0)  # leave the child behind, alive


def _linger(release, started):
    started.set()
    release.wait(60)
