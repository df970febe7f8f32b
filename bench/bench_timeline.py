"""How long does a big timeline take to draw? (issue #5: 100,000 events in ≤ 1 s)

A synthetic trace shaped like a busy real one: a main process and 7 workers, each with a feeder
thread; messages between them (put, feed, get), copies into shared memory with their segments
(create/attach/detach), lock waits and holds, and the user's marks -- 100,000 events in all.
The time measured (wall clock, and this process's CPU time, which a busy machine does not
inflate) is the whole job: ``mpviz.viz.timeline(trace)`` on a fresh ``Trace`` (so the
analyses are computed, not cached) until the PNG bytes exist (``savefig``).

Prints a Markdown line and writes JSON to bench/results/. ``--quick``: 20,000 events, one rep.
"""
import argparse
import io
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.run import save_results  # noqa: E402
from mpviz.trace import Trace  # noqa: E402


def synthetic_events(n_events, n_workers=7, seed=0):
    """About `n_events` events of a main process and `n_workers` workers."""
    rng = random.Random(seed)
    main = 1000
    workers = [main + 1 + i for i in range(n_workers)]
    feeder = {pid: pid + 500 for pid in [main] + workers}
    ev, t = [], 1_000_000_000
    ev.append((t, main, main, "process.start", {"how": "record", "ppid": 1, "name": "MainProcess"}))
    for i, w in enumerate(workers):
        t += 1000
        ev.append((t, main, main, "process.launch", {"child": w, "name": f"SpawnPoolWorker-{i+1}",
                                                      "start_method": "spawn"}))
        ev.append((t + 500, w, w, "process.start", {"how": "spawn", "ppid": main,
                                                    "name": "MainProcess"}))
    msg, seg = 0, 0
    while len(ev) < n_events - 2 * n_workers:
        t += rng.randint(2_000, 20_000)
        roll = rng.random()
        src, dst = rng.sample([main] + workers, 2)
        if roll < 0.45:                                   # a message: put, feed, get
            msg += 1
            mid = f"{src}.{msg}"
            ev.append((t, src, src, "queue.put", {"queue": "q1", "msg": mid}))
            ev.append((t + 300, src, feeder[src], "queue.feed",
                       {"queue": "q1", "msg": mid, "nbytes": rng.choice([180, 370, 400_000])}))
            ev.append((t + 9_000, dst, dst, "queue.get", {"queue": "q1", "msg": mid}))
        elif roll < 0.60:                                 # a tensor moved to shared memory
            seg += 1
            name = f"/mpviz_fd_{seg:08x}"
            a = {"name": name, "strategy": "file_descriptor", "nbytes": 400_000}
            ev.append((t, src, src, "shm.create", a))
            ev.append((t + 200, src, src, "copy", a))
            ev.append((t + 5_000, dst, dst, "shm.attach", a))
            ev.append((t + 9_000, dst, dst, "shm.detach", a))
        elif roll < 0.75:                                 # a lock: wait, acquire, release
            lock = f"mp-lock{rng.randint(1, 3)}"
            ev.append((t, src, src, "lock.wait", {"lock": lock, "type": "Lock"}))
            ev.append((t + 4_000, src, src, "lock.acquire", {"lock": lock, "type": "Lock"}))
            ev.append((t + 6_000, src, src, "lock.release", {"lock": lock, "type": "Lock"}))
        else:
            ev.append((t, src, src, "mark", {"name": "step", "i": len(ev)}))
    for w in workers:
        t += 1000
        ev.append((t, w, w, "process.exit", {"exitcode": 0}))
        ev.append((t + 100, main, main, "process.reaped", {"child": w, "exitcode": 0,
                                                          "signal": None}))
    return ev


def draw_once(events):
    from mpviz import viz
    trace = Trace(None, events=events)          # fresh: nothing cached
    start, cpu = time.perf_counter(), time.process_time()
    fig = viz.timeline(trace)
    fig.savefig(io.BytesIO(), format="png", dpi=72)
    return time.perf_counter() - start, time.process_time() - cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 events, one repetition")
    args = parser.parse_args(argv)
    n, reps = (20_000, 1) if args.quick else (100_000, 3)
    events = synthetic_events(n)
    draw_once(synthetic_events(2_000))          # warm up fonts and imports
    runs = [draw_once(events) for _ in range(reps)]
    times, cpus = [w for w, _ in runs], [c for _, c in runs]
    best, best_cpu = min(times), min(cpus)
    load = os.getloadavg()[0]
    results = dict(
        machine=dict(python=platform.python_version(), cpu=platform.processor() or
                     platform.machine(), cores=os.cpu_count()),
        quick=args.quick, events=len(events), seconds=times, cpu_seconds=cpus, best_s=best,
        best_cpu_s=best_cpu, load_average=load, target_s=1.0, ok=best <= 1.0)
    print(f"| timeline of {len(events):,} events (timeline() + PNG) | best {best:.2f} s wall, "
          f"{best_cpu:.2f} s CPU, of {reps} (load average {load:.1f}) | target ≤ 1 s: "
          f"{'met' if best <= 1.0 else 'MISSED'} |")
    path = save_results(f"timeline-{'quick-' if args.quick else ''}"
                        f"{time.strftime('%Y%m%d-%H%M%S')}.json", results)
    print(f"written to {path}")
    return results


if __name__ == "__main__":
    main()
