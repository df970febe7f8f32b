"""How much does recording cost? (issue #4)

Two measurements:

1. ``emit``: the time per event of ``mpviz.trace.mark(...)`` in a tight loop (recording on), and
   of the guarded check ``if recorder.ENABLED:`` the core's call sites pay when nobody records.
   Where VizTracer is installed, its custom event (``log_instant``) is timed in turn with ours:
   issue #4 set "≤ 0.5 µs" where VizTracer's took 0.65–0.70 µs, and this machine's speed
   drifts by 2x, so the ratio measured side by side is what says whether that still holds.
   Recording is measured with each Writer there is here: the C one (writer.c, when it could be
   built) and the pure-Python one (``MPVIZ_PURE_PYTHON=1``); see mpviz/trace/recorder.py.
2. ping-pong: a parent and a child bounce one small message back and forth through two stdlib
   ``multiprocessing.Queue``s, N round trips; recorded, every message costs a put, a feed and a
   get event, and no change to its bytes (linked by pipe order: see mpviz/trace/messages.py).
   The same with two mpviz Queues, whose put writes the pipe itself: two events a message.
   A get that finds nothing to read yet is also a recorded wait (one more event, ``wait.begin``:
   the read's get event ends it; see mpviz/trace/waits.py); in a ping-pong that is most gets.

Prints a Markdown table and writes JSON to bench/results/. Run ``python bench/bench_recorder.py``
(``--quick`` for a smoke run). Each timing is the best of several repetitions.

The ping-pong's ratio is noisy on a small or virtual machine: which CPU each of its four threads
wakes on changes a round trip by up to 2x from one run to the next. So recorded and unrecorded
runs alternate, and besides the ratio of the best runs the table gives the median of the ratios
of each adjacent pair (``--reps`` pairs). ``--cpu N`` runs the ping-pong on CPU N alone: no
cross-CPU wake-ups, so the ratio says what recording costs in CPU time, with far less noise.

``--before OLD_CHECKOUT`` compares the recorder of another checkout with this one, side by side:
only the two ping-pongs, each round in a fresh interpreter per checkout (unrecorded, then
recorded; stdlib Queues, then mpviz's), the checkouts alternating (``--reps`` rounds; with
``--cpu N`` pinned). Old code's C files are built into the cache like ours.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.run import save_results  # noqa: E402
import mpviz  # noqa: E402
import mpviz.trace as mt  # noqa: E402
from mpviz.trace import native, recorder  # noqa: E402


def echo(inbox, outbox, n):
    for _ in range(n):
        outbox.put(inbox.get())


def ping_pong(ctx, n):
    a, b = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=echo, args=(a, b, n))
    child.start()
    a.put(0)                                  # warm up: the child is running, feeders started
    b.get()
    t = time.perf_counter()
    for i in range(n - 1):
        a.put(i)
        b.get()
    elapsed = time.perf_counter() - t
    child.join()
    return elapsed / (n - 1)


def emit_cost(n):
    mark = mt.mark
    t = time.perf_counter()
    for i in range(n):
        mark("tick", i=i)
    return (time.perf_counter() - t) / n


def emit_cost_as_written(n):
    """The same, called as mpviz.trace's docs write it: ``mpviz.trace.mark(...)``, two
    attribute look-ups per event (a lazily loaded name must not cost an import each time)."""
    t = time.perf_counter()
    for i in range(n):
        mpviz.trace.mark("tick", i=i)
    return (time.perf_counter() - t) / n


def guard_cost(n):
    t = time.perf_counter()
    for i in range(n):
        if recorder.ENABLED:
            recorder.emit("tick", i=i)
    loop = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        pass
    return max(0.0, loop - (time.perf_counter() - t)) / n


def best(fn, reps):
    return min(fn() for _ in range(reps))


def viztracer_cost(n):
    """The time per custom event of VizTracer (``log_instant``), the tracer issue #4 compares
    with: its tracer on, but told to record no function calls, so only the events are timed."""
    from viztracer import VizTracer
    tracer = VizTracer(tracer_entries=2 * n + 1000, verbose=0, include_files=["/nonexistent/"])
    tracer.start()
    log = tracer.log_instant
    t = time.perf_counter()
    for i in range(n):
        log("tick", args={"i": i})
    elapsed = time.perf_counter() - t
    tracer.stop()
    tracer.clear()
    return elapsed / n


def side_by_side_with_viztracer(n, reps):
    """(mpviz's mark, VizTracer's custom event), best of `reps` each, measured in turn; or None
    where VizTracer is not installed (``pip install viztracer``)."""
    try:
        import viztracer  # noqa: F401
    except ImportError:
        return None
    ours, theirs = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            with mt.record(os.path.join(tmp, "t")):
                ours.append(emit_cost(n))
        theirs.append(viztracer_cost(n))
    return min(ours), min(theirs)


_ONE_ROUND = r"""
import json, os, sys, tempfile
sys.path.insert(0, os.getcwd())
if sys.argv[2] != "-":
    os.sched_setaffinity(0, {int(sys.argv[2])})
import multiprocessing as mp
import mpviz.multiprocessing as mmp
import mpviz.trace as mt
from bench.bench_recorder import ping_pong
n, out = int(sys.argv[1]), {}
for name, ctx in [("stdlib", mp.get_context("fork")), ("mpviz", mmp.get_context("fork"))]:
    off = ping_pong(ctx, n)
    with tempfile.TemporaryDirectory() as tmp:
        with mt.record(os.path.join(tmp, "t")):
            on = ping_pong(ctx, n)
    out[name] = (off, on)
print(json.dumps(out))
"""


def side_by_side(before, rounds, n, cpu):
    """The ping-pongs of checkout `before` and of this one, alternating (see the top)."""
    import subprocess
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"before": os.path.abspath(before), "now": here}
    runs = {t: {"stdlib": [], "mpviz": []} for t in trees}
    for r in range(rounds):
        for t in (list(trees) if r % 2 == 0 else list(trees)[::-1]):   # each first half the time
            done = subprocess.run(
                [sys.executable, "-c", _ONE_ROUND, str(n), "-" if cpu is None else str(cpu)],
                cwd=trees[t], env=dict(os.environ, PYTHONPATH=trees[t]),
                capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"the ping-pong in {trees[t]} failed:\n{done.stderr}")
            for name, pair in json.loads(done.stdout.splitlines()[-1]).items():
                runs[t][name].append(pair)
    where = f", CPU {cpu} only" if cpu is not None else ""
    print(f"| ping-pong ({n} msgs, fork{where}), medians of {rounds} rounds | not recording | "
          f"recording | recorded ÷ not |")
    print("|---|---|---|---|")
    for name in ("stdlib", "mpviz"):
        for t in trees:
            pairs = runs[t][name]
            off = statistics.median(p[0] for p in pairs) * 1e6
            on = statistics.median(p[1] for p in pairs) * 1e6
            ratio = statistics.median(p[1] / p[0] for p in pairs)
            print(f"| {name} Queues, {t} ({trees[t]}) | {off:.1f} µs | {on:.1f} µs | "
                  f"{ratio:.2f}× |")
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--start-method", default="fork")
    parser.add_argument("--reps", type=int,
                        help="ping-pong pairs (recorded, unrecorded); default 7 (--quick: 2)")
    parser.add_argument("--cpu", type=int, help="run the ping-pong on this CPU only")
    parser.add_argument("--before", metavar="OLD_CHECKOUT",
                        help="only the ping-pongs, that checkout's recorder against this one's, "
                             "alternating (e.g. from `git worktree add /tmp/old <commit>`)")
    args = parser.parse_args(argv)
    if args.before is not None:
        if not os.path.isdir(os.path.join(args.before, "mpviz")):
            parser.error(f"--before {args.before!r} holds no mpviz/ package: give the root of "
                         f"another checkout (git worktree add /tmp/old <commit>)")
        return side_by_side(args.before, args.reps or (2 if args.quick else 7),
                            2_000 if args.quick else 5_000, args.cpu)
    # Seven ping-pong pairs by default: on this project's 2-core machine one pair's ratio ranged
    # from 0.92 to 1.24 within one run of nine (2026-11-22), too wide for a median of three.
    n_events, n_msgs, reps, pairs = (20_000, 2_000, 2, 2) if args.quick else (200_000, 10_000, 3, 7)
    if args.reps is not None:
        pairs = args.reps
    if pairs < 1:
        parser.error(f"--reps must be at least 1 (got {pairs}): the ratio needs a pair")
    ctx = mp.get_context(args.start_method)

    guard = best(lambda: guard_cost(n_events), reps)
    off = best(lambda: emit_cost(n_events), reps)           # mark() when not recording
    written_off = best(lambda: emit_cost_as_written(n_events), reps)
    on_by_writer = {}
    default = os.environ.pop("MPVIZ_PURE_PYTHON", None)
    try:
        for name in ["Python"] + (["C"] if native.load() is not None else []):
            os.environ["MPVIZ_PURE_PYTHON"] = "1" if name == "Python" else "0"  # read by record()
            with tempfile.TemporaryDirectory() as tmp:
                with mt.record(os.path.join(tmp, "t")):
                    on_by_writer[name] = best(lambda: emit_cost(n_events), reps)
    finally:
        os.environ.pop("MPVIZ_PURE_PYTHON", None)
        if default is not None:
            os.environ["MPVIZ_PURE_PYTHON"] = default
    with tempfile.TemporaryDirectory() as tmp:                # the default Writer
        with mt.record(os.path.join(tmp, "t")):
            written_on = best(lambda: emit_cost_as_written(n_events), reps)
    vt = side_by_side_with_viztracer(n_events, reps)
    import mpviz.multiprocessing as mpviz_mp
    mpviz_ctx = mpviz_mp.get_context(args.start_method)
    pp_off, pp_on, mq_off, mq_on = [], [], [], []
    if args.cpu is not None:
        cpus = os.sched_getaffinity(0)                     # (Linux only: so only when asked)
        os.sched_setaffinity(0, {args.cpu})                # the child inherits it
    try:
        for _ in range(pairs):                             # interleaved: fair to both
            pp_off.append(ping_pong(ctx, n_msgs))
            with tempfile.TemporaryDirectory() as tmp:
                with mt.record(os.path.join(tmp, "t")) as trace:
                    writer = recorder.writer_name()        # what recording uses by default
                    pp_on.append(ping_pong(ctx, n_msgs))
            linked = sum(f.get is not None for f in trace.flows())
            waits = len(trace.of_kind("wait.begin"))      # gets that found nothing yet
            mq_off.append(ping_pong(mpviz_ctx, n_msgs))
            with tempfile.TemporaryDirectory() as tmp:
                with mt.record(os.path.join(tmp, "t")) as trace:
                    mq_on.append(ping_pong(mpviz_ctx, n_msgs))
            mq_linked = sum(f.get is not None for f in trace.flows())
            mq_waits = len(trace.of_kind("wait.begin"))
    finally:
        if args.cpu is not None:
            os.sched_setaffinity(0, cpus)
    on = on_by_writer[writer]
    paired = statistics.median(rec / plain for rec, plain in zip(pp_on, pp_off))
    pp_off, pp_on = min(pp_off), min(pp_on)
    mq_paired = statistics.median(rec / plain for rec, plain in zip(mq_on, mq_off))
    mq_off, mq_on = min(mq_off), min(mq_on)
    results = dict(
        machine=dict(python=platform.python_version(), cpu=platform.processor() or
                     platform.machine(), cores=os.cpu_count()),
        quick=args.quick, start_method=args.start_method,
        guard_ns=guard * 1e9, mark_off_ns=off * 1e9, mark_on_ns=on * 1e9, writer=writer,
        mark_on_ns_by_writer={k: v * 1e9 for k, v in on_by_writer.items()},
        mark_as_written_off_ns=written_off * 1e9, mark_as_written_on_ns=written_on * 1e9,
        viztracer_side_by_side_ns=None if vt is None else {"mpviz_mark": vt[0] * 1e9,
                                                           "viztracer_log_instant": vt[1] * 1e9},
        c_writer_problem=native.problem,
        pingpong_messages=n_msgs, pingpong_off_us=pp_off * 1e6, pingpong_on_us=pp_on * 1e6,
        pingpong_ratio=pp_on / pp_off, pingpong_paired_ratio_median=paired,
        pingpong_pairs=pairs, pingpong_cpu=args.cpu, pingpong_flows_linked=linked,
        mpviz_queue_pingpong_flows_linked=mq_linked,
        pingpong_waits=waits, mpviz_queue_pingpong_waits=mq_waits,
        mpviz_queue_pingpong_off_us=mq_off * 1e6, mpviz_queue_pingpong_on_us=mq_on * 1e6,
        mpviz_queue_pingpong_ratio=mq_on / mq_off,
        mpviz_queue_pingpong_paired_ratio_median=mq_paired)
    print("| measurement | not recording | recording | ratio |")
    print("|---|---|---|---|")
    print(f"| guarded check `if recorder.ENABLED:` | {guard * 1e9:.0f} ns | — | — |")
    for name, t in on_by_writer.items():
        print(f"| `mark()` per event, {name} Writer | {off * 1e9:.0f} ns | {t * 1e9:.0f} ns | — |")
    print(f"| `mpviz.trace.mark()` per event, the module path spelled out at every call, "
          f"{writer} Writer (goal ≤ 0.5 µs) | {written_off * 1e9:.0f} ns | "
          f"{written_on * 1e9:.0f} ns | — |")
    if vt is None:
        print("| custom event, VizTracer's `log_instant` | — | not installed "
              "(`pip install viztracer` to compare) | — |")
    else:
        print(f"| custom event side by side: mpviz `mark()` ({writer} Writer) vs VizTracer's "
              f"`log_instant` | — | {vt[0] * 1e9:.0f} ns vs {vt[1] * 1e9:.0f} ns "
              f"| {vt[0] / vt[1]:.2f}× VizTracer |")
    where = f", CPU {args.cpu} only" if args.cpu is not None else ""
    print(f"| ping-pong round trip ({n_msgs} msgs, {args.start_method}, {writer} Writer{where}) "
          f"| {pp_off * 1e6:.1f} µs | {pp_on * 1e6:.1f} µs | {pp_on / pp_off:.2f}× "
          f"(median of {pairs} pairs: {paired:.2f}×) |")
    print(f"| the same through mpviz Queues (2 events a message) "
          f"| {mq_off * 1e6:.1f} µs | {mq_on * 1e6:.1f} µs | {mq_on / mq_off:.2f}× "
          f"(median of {pairs} pairs: {mq_paired:.2f}×) |")
    print(f"\n(recorded waits in the last ping-pong of each: {waits} stdlib, {mq_waits} mpviz, "
          f"of {2 * n_msgs} gets -- a get that finds nothing to read yet records wait.begin, "
          f"and its read's queue.get ends the wait: in a ping-pong most gets wait for the other "
          f"side)")
    for name, n in [("stdlib", linked), ("mpviz", mq_linked)]:  # the last recorded run of each
        if n != 2 * n_msgs:
            print(f"\n(only {n} of the {2 * n_msgs} messages of a recorded {name} ping-pong "
                  f"were linked put → get: a recording that measured fast but lost links)")
    if native.problem:
        print(f"\n(no C Writer here: {native.problem})")
    path = save_results(f"recorder-{time.strftime('%Y%m%d-%H%M%S')}.json", results)
    print(f"\nwritten to {path}")
    return results


if __name__ == "__main__":
    main()
