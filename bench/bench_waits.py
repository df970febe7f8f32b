"""What recording a blocking wait costs (mpviz.trace.waits).

For waits that return at once (the worst case: the two events are all the work there is), the
time per call three ways: the stdlib unpatched; the hooks installed but not recording (a booted
child between recordings); recording. And the events one call adds. Then a feeder thread's
write of a small message, plain and through the full-pipe check (one ioctl per write). Then a
Queue's get, recorded (stdlib and mpviz Queues): one that finds its message at once (it asks
with one poll(2) first, and records nothing more), and the same get recorded as a wait
(``messages.waiting_get``: the wait's two events, without really blocking).

Run ``python bench/bench_waits.py``. Each time is the best of several repetitions: on a shared
machine the spread between runs is larger than the differences, so read them as a scale.
"""
import os
import sys
import tempfile
import time
import timeit
from concurrent.futures import Future
import multiprocessing as mp
from multiprocessing import Pipe

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpviz.trace as mt  # noqa: E402
from mpviz.trace import hooks  # noqa: E402
from mpviz.trace.waits import feeder_writes  # noqa: E402

N = 20_000


def best(fn, n=N):
    return min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6


def cases(ctx):
    ev = ctx.Event()
    ev.set()
    jq = ctx.JoinableQueue()
    p = ctx.Process(target=int)
    p.start()
    p.join()
    fut = Future()
    fut.set_result(1)
    return {"Event.wait, already set": ev.wait,
            "JoinableQueue.join, nothing unfinished": jq.join,
            "Process.join, child already reaped": p.join,
            "Future.result, done": fut.result}


def events_per_call(ctx, name):
    """The wait events of one call (the objects made while recording: a method bound before
    recording started is the stdlib's own, and records nothing)."""
    with tempfile.TemporaryDirectory() as tmp:
        with mt.record(os.path.join(tmp, "t")) as trace:
            fn = cases(ctx)[name]
            t = time.monotonic_ns()
            fn()
        return len([e for e in trace.events if e.ts_ns >= t and e.pid == os.getpid()
                    and e.kind.startswith("wait.")])


def main():
    ctx = mp.get_context("fork")
    rows = {name: [best(fn)] for name, fn in cases(ctx).items()}
    hooks.install()
    try:
        for name, fn in cases(ctx).items():
            rows[name].append(best(fn))
    finally:
        hooks.uninstall()
    with tempfile.TemporaryDirectory() as tmp:
        with mt.record(os.path.join(tmp, "t")):
            for name, fn in cases(ctx).items():
                rows[name].append(best(fn))
    print(f"| wait (returns at once) | stdlib µs | hooks, not recording µs | recording µs | "
          f"events |\n|---|---|---|---|---|")
    for name, (a, b, c) in rows.items():
        print(f"| {name} | {a:.2f} | {b:.2f} | {c:.2f} | {events_per_call(ctx, name)} |")

    r, w = Pipe(duplex=False)
    buf = b"x" * 100
    checked = feeder_writes(w.send_bytes, "q", w.fileno())

    def plain():
        w.send_bytes(buf)
        r.recv_bytes()

    def through_check():
        checked(buf)
        r.recv_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        with mt.record(os.path.join(tmp, "t")):
            a, b = best(plain), best(through_check)
    print(f"\nfeeder write of 100 B (+ its read): {a:.2f} µs plain, {b:.2f} µs through the "
          f"full-pipe check (+{b - a:.2f} µs, no event when it fits)")
    r.close()
    w.close()
    queue_gets()
    thread_queues()


def queue_gets(n=2_000):
    """µs per get of a message already in the pipe, recorded: plain, and as a recorded wait."""
    import mpviz.multiprocessing as mpviz_mp
    from mpviz.trace import messages
    print("\n| recorded get of a message already there | get µs | as a recorded wait µs |"
          "\n|---|---|---|")
    for name, ctx in [("stdlib Queue", mp.get_context("fork")),
                      ("mpviz Queue", mpviz_mp.get_context("fork"))]:
        times = {"get": [], "wait": []}
        with tempfile.TemporaryDirectory() as tmp:
            with mt.record(os.path.join(tmp, "t")):
                q = ctx.Queue()
                get = type(q).get
                for _ in range(3):
                    for how in times:
                        for i in range(n):
                            q.put(i)
                        while q.empty():          # the feeder has started writing
                            time.sleep(0.01)
                        time.sleep(0.2)           # ... and has written them all
                        t = time.perf_counter()
                        if how == "get":
                            for _ in range(n):
                                q.get()
                        else:
                            for _ in range(n):
                                messages.waiting_get(None, get, q, True, None)
                        times[how].append((time.perf_counter() - t) / n * 1e6)
        print(f"| {name} | {min(times['get']):.2f} | {min(times['wait']):.2f} |")


def thread_queues(n=200_000):
    """The stdlib's queue.Queue between threads (waits.py's thread_queue hooks): µs per put +
    get from this module (the program's own code: each caller looked at once), three ways;
    and a producer thread putting `n` items for the main thread, off and recorded."""
    import queue
    import threading

    def pair(q=queue.Queue()):
        q.put(1)
        q.get()

    def handoff():
        q = queue.Queue()
        t = threading.Thread(target=lambda: [q.put(i) for i in range(n)] and q.put(None))
        t0 = time.perf_counter()
        t.start()
        while q.get() is not None:
            pass
        t.join()
        return time.perf_counter() - t0
    plain, off = best(pair), handoff()
    hooks.install()
    try:
        installed = best(pair)
    finally:
        hooks.uninstall()
    with tempfile.TemporaryDirectory() as tmp:
        with mt.record(os.path.join(tmp, "t")):
            recorded, on = best(pair), handoff()
    print(f"\n| queue.Queue (threads) | stdlib | hooks, not recording | recording |\n"
          f"|---|---|---|---|\n| put + get, µs | {plain:.2f} | {installed:.2f} | "
          f"{recorded:.2f} |\n| {n:,} items from a producer thread, s | {off:.2f} | — | "
          f"{on:.2f} ({on / off:.2f}×) |")


if __name__ == "__main__":
    main()
