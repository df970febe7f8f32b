"""Programs for tests/test_stepper.py (importable: the stepped run is a fresh interpreter)."""
import multiprocessing

from mpviz.stepper import name


def _take(first, second):
    with first:
        with second:
            pass


def two_locks(start_method="fork", same_order=False):
    ctx = multiprocessing.get_context(start_method)
    a, b = name(ctx.Lock(), "A"), name(ctx.Lock(), "B")
    p = ctx.Process(target=_take, args=(a, b) if same_order else (b, a), name="child")
    p.start()
    _take(a, b)
    p.join()


def crash():
    raise SystemExit(3)


def child_crashes(start_method="fork"):
    ctx = multiprocessing.get_context(start_method)
    lock = name(ctx.Lock(), "L")
    p = ctx.Process(target=crash, name="child")
    p.start()
    with lock:
        pass
    p.join()


def _notify(cond, pipe, done):
    import mpviz
    with cond:
        cond.notify()
    pipe.send("hello")
    pipe.send(mpviz.ones(8))
    done.wait()          # file_descriptor: the receiver fetches the fd from us, so stay alive


def condition_and_pipe(start_method="fork"):
    """The child notifies a Condition main waits on, then sends on a pipe main receives from:
    a word, then a tensor (main maps its shared memory)."""
    import mpviz.multiprocessing  # noqa: F401  (tensors travel as handles)
    ctx = multiprocessing.get_context(start_method)
    cond, done = name(ctx.Condition(), "C"), name(ctx.Event(), "done")
    receiver, sender = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_notify, args=(cond, sender, done), name="child")
    with cond:
        p.start()
        cond.wait()
    assert receiver.recv() == "hello"
    t = receiver.recv()
    done.set()
    assert float(t.sum()) == 8.0
    del t
    p.join()


def _send_tensor(q, done):
    import mpviz
    q.put(mpviz.ones(1024))
    done.wait()          # file_descriptor: the receiver fetches the fd from us, so stay alive


def mpviz_queue_tensor(start_method="fork", strategy="file_system"):
    """A child puts a tensor on an mpviz Queue; main gets it (its shared memory is mapped)."""
    import mpviz.multiprocessing as mp
    mp.set_sharing_strategy(strategy)
    ctx = mp.get_context(start_method)
    q, done = name(ctx.Queue(), "Q"), name(ctx.Event(), "done")
    p = ctx.Process(target=_send_tensor, args=(q, done), name="child")
    p.start()
    t = q.get()
    done.set()
    assert float(t.sum()) == 1024.0
    del t
    p.join()


def main_killed():
    """main takes a lock, then is killed by SIGKILL (as the OOM killer would): no exception."""
    import os
    import signal
    lock = name(multiprocessing.Lock(), "L")
    with lock:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def sleeper(seconds=2.5):
    """No stop at all: the main thread just sleeps (waits for time, not for another thread)."""
    import time
    time.sleep(seconds)
    return "slept"


def waits_on_a_pipe_with_a_timeout(seconds=2.0):
    """No stop at all: the main thread waits for a pipe nobody writes, with a timeout (select):
    time ends the wait, as it ends a Queue.get(timeout=) or a lock.acquire(timeout=)."""
    import os
    import select
    r, w = os.pipe()
    ready = select.select([r], [], [], seconds)[0]
    os.close(r)
    os.close(w)
    return "timed out" if not ready else "read"


def _sleep_then_put(q, seconds):
    import time
    time.sleep(seconds)
    q.put("late")


def parent_gets_while_child_sleeps(seconds=2.0):
    """main blocks in get() while the only one who can put is asleep: time moves the run."""
    q = name(multiprocessing.Queue(), "Q")
    p = multiprocessing.Process(target=_sleep_then_put, args=(q, seconds), name="child")
    p.start()
    item = q.get()
    p.join()
    return item


def _out_of_memory(q):
    raise MemoryError("simulated: the child could not allocate its item")


def child_dies_of_memory_error():
    """The child dies of MemoryError before its put; main waits in get() for ever after."""
    q = name(multiprocessing.Queue(), "Q")
    p = multiprocessing.Process(target=_out_of_memory, args=(q,), name="child")
    p.start()
    q.get()
    p.join()


def busy(seconds=8.0):
    """Computes between two stops for `seconds` (no sleep, no stop)."""
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def naps_then_takes_a_lock(seconds=3.0):
    """main sleeps, then takes a lock: time alone brings it to its first stop."""
    import time
    lock = name(multiprocessing.Lock(), "L")
    time.sleep(seconds)
    with lock:
        pass


def _bad_config():
    raise ValueError("bad config")


def _worker_takes(a, b):
    import time
    with b:
        time.sleep(0.2)
        with a:
            pass


def helper_crashed_then_lock_order_deadlock():
    """A helper process dies of an error (main joins it and goes on); then main and a worker
    take two locks in opposite orders: a deadlock between the two, the death unrelated."""
    import time
    helper = multiprocessing.Process(target=_bad_config, name="helper")
    helper.start()
    helper.join()
    a, b = name(multiprocessing.Lock(), "A"), name(multiprocessing.Lock(), "B")
    worker = multiprocessing.Process(target=_worker_takes, args=(a, b), name="worker")
    worker.start()
    with a:
        time.sleep(0.2)
        with b:
            pass
    worker.join()


def _poll_until_set(ev, seconds):
    import time
    while not ev.is_set():
        time.sleep(seconds)


def child_polls_an_event_nobody_sets(seconds=0.3):
    """The child looks at an Event every `seconds` (no stop between two looks); main joins it."""
    ev = name(multiprocessing.Event(), "E")
    p = multiprocessing.Process(target=_poll_until_set, args=(ev, seconds), name="child")
    p.start()
    p.join()


def two_children_sleep(seconds=2.0):
    """Two children sleep, then end; main joins them. One schedule: no stop has two choices."""
    import time
    children = [multiprocessing.Process(target=time.sleep, args=(seconds,), name=f"c{i}")
                for i in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()


def _take_one(lock):
    with lock:
        pass


def helper_crashed_then_join_while_holding_the_lock():
    """A helper dies of an error (joined); then main joins a worker while holding the lock the
    worker needs: a deadlock between the two (the join waits for the worker, the worker for
    the lock), the death unrelated."""
    helper = multiprocessing.Process(target=_bad_config, name="helper")
    helper.start()
    helper.join()
    lock = name(multiprocessing.Lock(), "A")
    worker = multiprocessing.Process(target=_take_one, args=(lock,), name="worker")
    with lock:
        worker.start()
        worker.join()
