"""Worker functions for the picture tests (importable: spawn cannot pickle test-local ones).

Three small real programs whose traces the pictures are tested on:

* ``producer``/``consumer``: tensors through an ``mpviz.multiprocessing.Queue`` (the first put
  copies each tensor into shared memory, every message after that is a small handle);
* ``leaky_holder``: under ``file_system`` with the shm manager off, a process that makes a
  shared tensor, says its name, and is SIGKILLed -- its segment stays in ``/dev/shm``;
* ``hold_in_a_thread`` + ``take``: a helper thread holds a lock while the main thread forks; the child's
  copy of the lock is held by a thread that does not exist in the child, so it waits forever.
"""
import os
import signal
import threading

import numpy as np

import mpviz
import mpviz.multiprocessing as mp
import mpviz.trace as mt


def producer(q, n, size, done, big=0):
    """Put `n` fresh tensors of `size` floats, then one of them again, then the end marker.

    It stays alive until the consumer says `done`: under file_descriptor the consumer fetches
    each tensor's fd from this (live) process."""
    sent = []
    for i in range(n):
        t = mpviz.ones(size) * i
        q.put(t)
        sent.append(t)
    q.put(sent[0])                           # already shared: travels as a handle, no copy
    if big:
        q.put(np.ones(big))                  # a plain NumPy array: pickled, bytes and all
    q.put(None)
    done.wait()
    q.close()
    q.join_thread()                           # flush the feeder before exiting


def consumer(q, results, done):
    total = 0.0
    while True:
        t = q.get()
        if t is None:
            break
        total += float((t.numpy() if hasattr(t, "numpy") else t).sum())
        del t
    done.set()
    results.put(total)


def leaky_holder(names):
    """Share a tensor (file_system), report its segment, then die by SIGKILL holding it."""
    t = mpviz.zeros(1024)
    t.share_memory_()
    names.put(t.untyped_storage().segment_name)
    names.close()
    names.join_thread()
    os.kill(os.getpid(), signal.SIGKILL)


def hold_in_a_thread(lock):
    """Start a helper thread that takes `lock` and keeps it until the returned event is set."""
    held, done = threading.Event(), threading.Event()

    def helper():
        with lock:
            held.set()
            done.wait()

    t = threading.Thread(target=helper, name="helper")
    t.start()
    held.wait()
    return t, done


def take(lock):
    """The forked child: take the (copied, forever held) lock."""
    mt.mark("taking the lock")
    with lock:
        mt.mark("never reached")


def cross(first, second, ready, go):
    """Take `first`, wait until told, then take `second`: two of these, crossed, deadlock."""
    with first:
        ready.set()
        go.wait()
        with second:
            mt.mark("never reached")


def producer_consumer(start_method="fork", n=3, size=100_000, big=0):
    """The whole producer/consumer run (for the Live widget's tests); returns a sentence."""
    ctx = mp.get_context(start_method)
    q, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    prod = ctx.Process(target=producer, args=(q, n, size, done, big), name="producer")
    cons = ctx.Process(target=consumer, args=(q, results, done), name="consumer")
    prod.start()
    cons.start()
    total = results.get()
    prod.join()
    cons.join()
    q.close()
    results.close()
    q.join_thread()
    results.join_thread()
    return f"the consumer summed {total:g}"


def wait_in_a_child(release, start_method="fork"):
    """Start a child that waits until `release` (an mp Event) is set; return when it has."""
    ctx = mp.get_context(start_method)
    child = ctx.Process(target=_wait, args=(release,), name="waiter")
    child.start()
    child.join()
    return f"child exit code {child.exitcode}"


def _wait(release):
    mt.mark("waiting")
    release.wait()
