"""Programs and worker functions for tests/test_trace_waits.py (importable by spawned children).

Run as a program, it plays one of the two classic hangs, for ``python -m mpviz trace``::

    python tests/wait_workers.py join_before_get     # joins a child whose feeder cannot write
    python tests/wait_workers.py missing_task_done   # q.join() with one task_done() missing
    python tests/wait_workers.py missing_sentinel    # a consumer's get waits for ever
"""
import multiprocessing as mp
import sys
import time

BIG = 1_000_000            # more than a pipe holds (64 KiB): the feeder's write blocks


# --- the two hangs -----------------------------------------------------------------------------

def put_big(q):
    q.put(b"x" * BIG)


def join_before_get():
    """The stdlib's own warning: a child that put a big item cannot exit until it is read, so
    joining it before the get waits for ever."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=put_big, args=(q,), name="producer")
    p.start()
    p.join()                                   # hangs here: the item is never read
    print(len(q.get()))


def forgetful_consumer(q):
    """Takes every item but marks one of them done: q.join() in the producer never returns."""
    while True:
        item = q.get()
        if item is None:
            q.task_done()
            return
        if item != 2:                          # the forgotten task_done()
            q.task_done()


def missing_task_done():
    ctx = mp.get_context("fork")
    q = ctx.JoinableQueue()
    p = ctx.Process(target=forgetful_consumer, args=(q,), name="consumer")
    p.start()
    for i in range(5):
        q.put(i)
    q.put(None)
    q.join()                                   # hangs here: one task is never done
    p.join()


def put_two(q):
    """A producer that forgets its sentinel: two items, then it ends."""
    q.put(1)
    q.put(2)


def missing_sentinel():
    """The consumer reads until None, which never comes: its third get waits for ever."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=put_two, args=(q,), name="producer")
    p.start()
    while q.get() is not None:                 # hangs here, in the third get
        pass
    p.join()


# --- waits that end (test_waits_that_end_are_recorded_with_both_ends) ---------------------------

def set_later(ev):
    time.sleep(0.1)
    ev.set()


def notify_later(cond):
    with cond:                                 # only possible once the parent waits
        cond.notify()


def release_later(sem):
    time.sleep(0.1)
    sem.release()


def meet(barrier):
    time.sleep(0.1)
    barrier.wait()


def barrier_pair():
    """Two processes meet at a Barrier (made here, in a child: a Barrier's shared counters live
    in multiprocessing's heap, whose file the process keeps open for good)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    p = ctx.Process(target=meet, args=(barrier,))
    p.start()
    barrier.wait(timeout=10)
    p.join()


def put_later(q, items=(1,)):
    time.sleep(0.2)
    for x in items:
        q.put(x)


def put_into_queue_queue(q):
    """One put into a queue.Queue (a thread queue: in a forked child, into its own copy)."""
    q.put("x")


def get_later(q, n=1):
    time.sleep(0.2)
    for _ in range(n):
        q.get()


def slow_square(x):
    time.sleep(0.1)
    return x * x


def finish_tasks(q):
    for _ in range(2):
        q.get()
        time.sleep(0.05)
        q.task_done()


if __name__ == "__main__":
    {"join_before_get": join_before_get, "missing_task_done": missing_task_done,
     "missing_sentinel": missing_sentinel}[sys.argv[1]]()
