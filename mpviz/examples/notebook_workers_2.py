"""Worker functions for the workshop notebooks 05-08 (spawn children import them from here).

A function defined in a notebook cell lives in the kernel's ``__main__``, which a ``spawn`` child
cannot import, so every function the notebooks start in another process is defined here. They
report what they did through a queue: a child's ``print`` reaches the notebook only as stray text
in whichever cell happens to be running (ipykernel forwards its file descriptors), not as a value.

    greet(rank, q)                          put (rank, pid) on q: who ran where
    fail_on(rank, failing_rank, seconds)    rank `failing_rank` raises ValueError at once;
                                            the others work for `seconds` (until terminated)
    kill_self(rank, victim, seconds)        rank `victim` is killed by SIGKILL (like the kernel's
                                            OOM killer does); the others work for `seconds`
    exit_with(rank, code)                   sys.exit(code) in every rank
    nap(rank, seconds)                      sleep for `seconds`, then return normally
    hogwild_worker(model, rank, epochs, lr) Hogwild's train(), marking the trace after each epoch
"""
import os
import signal
import sys
import time


def greet(rank, q):
    q.put((rank, os.getpid()))


def _work(seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:           # "work": small naps, so SIGTERM lands at once
        time.sleep(0.05)


def fail_on(rank, failing_rank, seconds=30.0):
    if rank == failing_rank:
        raise ValueError(f"boom from rank {rank}: this batch has a NaN")
    _work(seconds)


def kill_self(rank, victim, seconds=30.0):
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)     # what the OOM killer does to a process
    _work(seconds)


def exit_with(rank, code):
    sys.exit(code)


def nap(rank, seconds):
    time.sleep(seconds)


def hogwild_worker(model, rank, epochs=2, lr=0.1):
    """Hogwild's ``train`` (mpviz.examples), one epoch at a time, with a mark in the trace after each."""
    from mpviz.examples import train
    from mpviz.trace import mark
    for epoch in range(epochs):
        train(model, rank=rank * 100 + epoch, epochs=1, lr=lr)
        mark("epoch done", rank=rank, epoch=epoch)
