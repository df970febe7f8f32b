"""What mpviz's Event (mpviz/multiprocessing/synchronize.py) costs next to the stdlib's.

mpviz's Event writes who holds its lock, and each waiter its sleeper slot, into a small shared
array (so that ``set()`` survives a waiter killed inside ``wait()``). Per call, best of 5, fork
context, no waiter: ``is_set()``; ``set()`` then ``clear()``. Then a ping-pong between two
processes (each ``set()`` wakes the other's ``wait()``): one round trip.

Run ``python bench/bench_event.py``. On a shared machine read the numbers as a scale.
"""
import multiprocessing
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpviz.multiprocessing as mp  # noqa: E402

N, ROUNDS = 50_000, 2_000


def _pong(a, b, n):
    for _ in range(n):
        a.wait()
        a.clear()
        b.set()


def measure(ctx):
    ev = ctx.Event()
    is_set = min(timeit.repeat(ev.is_set, number=N, repeat=5)) / N
    set_clear = min(timeit.repeat(lambda: (ev.set(), ev.clear()), number=N, repeat=5)) / N
    best = None
    for _ in range(3):
        a, b = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_pong, args=(a, b, ROUNDS))
        p.start()
        start = time.perf_counter()
        for _ in range(ROUNDS):
            a.set()
            b.wait()
            b.clear()
        took = (time.perf_counter() - start) / ROUNDS
        p.join()
        best = took if best is None else min(best, took)
    return is_set, set_clear, best


if __name__ == "__main__":
    for label, ctx in (("stdlib", multiprocessing.get_context("fork")),
                       ("mpviz", mp.get_context("fork"))):
        i, s, r = measure(ctx)
        print(f"{label:7s} is_set {i * 1e6:5.2f} us   set+clear {s * 1e6:5.2f} us   "
              f"ping-pong round trip {r * 1e6:6.1f} us")
