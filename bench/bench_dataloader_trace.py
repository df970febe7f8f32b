"""What ``mpviz trace`` costs on a real torch DataLoader program (issue #27, item 4).

The program (``dataloader_program.py``): real torch, ``DataLoader(num_workers=8)`` over a small
in-memory Dataset, 10,000 batches. Measured side by side in one run, round after round, the
order flipped every round (so a burst of load from elsewhere hits both alike):

* untraced: ``python dataloader_program.py``, wall clock;
* traced: ``python -m mpviz trace -o DIR -- python dataloader_program.py``, as the README tells
  users (hang watchdog on, trace.json written, no pictures: the run ended well), wall clock;
  beside it, the program's own time for its loop (it prints it) and the CPU time of every
  process of the run (a busy machine stretches wall time, much less CPU time);
* drawing, in a fresh interpreter after each traced run: importing ``mpviz.viz`` (matplotlib),
  then the timeline, the memory map and the wait-for graph, each saved to PNG (what ``mpviz
  trace --plot`` and ``viz.plot`` draw). Reading the trace back is timed apart (the launcher
  has read it already, for trace.json, when it draws).

Prints Markdown lines (medians; min–max) and writes JSON to bench/results/. Goals: traced ÷
untraced ≤ 1.3×, drawing ≤ 5 s. ``--quick``: 200 batches, 2 workers, one round (a smoke run).
``--before DIR``: the traced run and the drawing of another checkout too (``PYTHONPATH=DIR``),
in turn with this one, for a before/after measured side by side. ``--no-draw``: the runs only.
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.run import save_results  # noqa: E402

PROGRAM = os.path.join(HERE, "dataloader_program.py")
RATIO_GOAL, DRAW_GOAL_S = 1.3, 5.0

# Run in a fresh interpreter on a finished trace directory: prints one JSON line of timings.
DRAW = r"""
import json, os, sys, time
t, c = time.perf_counter(), time.process_time()
import mpviz.trace
from mpviz import viz
out = {"import_s": time.perf_counter() - t, "cpu_import_s": time.process_time() - c}
t = time.perf_counter()
trace = mpviz.trace.load(sys.argv[1])
out["load_s"] = time.perf_counter() - t
for name in ("timeline", "memory_map", "wait_for"):
    t, c = time.perf_counter(), time.process_time()
    getattr(viz, name)(trace).savefig(os.path.join(sys.argv[1], name + ".png"))
    out[name + "_s"], out["cpu_" + name + "_s"] = time.perf_counter() - t, time.process_time() - c
out["events"] = len(trace.events)
print(json.dumps(out))
"""


def _env(tree=ROOT):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, env.get("PYTHONPATH")]))
    env["PYTHONWARNINGS"] = "ignore"       # torch's "8 workers on 2 cores" warning, each run
    return env


def _cpu():
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(argv, tree=ROOT):
    """(wall seconds, CPU seconds of the whole process tree, the finished run)."""
    start, cpu = time.perf_counter(), _cpu()
    r = subprocess.run(argv, cwd=tree, env=_env(tree), capture_output=True, text=True,
                       timeout=1800)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return wall, _cpu() - cpu, r


def _loop_s(run):
    """The program's own time for its loop, as it printed it ("N batches in S s")."""
    return float(run.stdout.split(" batches in ")[1].split()[0])


def one_round(i, batches, workers, scratch, trees, draw=True):
    """One round: the untraced run and each tree's traced run, in an order that turns each
    round; then each tree draws its own trace (unless not `draw`). `trees`: {suffix: checkout}."""
    program = [sys.executable, PROGRAM, str(batches), str(workers)]
    runs = [("untraced", program, ROOT)]
    for suffix, tree in trees.items():
        directory = os.path.join(scratch, f"round{i}{suffix.strip(' ()')}")
        runs.append((f"traced{suffix}", [sys.executable, "-m", "mpviz", "trace", "-o",
                                         directory, "--"] + program, tree))
    turn = i % len(runs)
    out = {}
    for name, argv, tree in runs[turn:] + runs[:turn]:
        out[name], out[f"cpu_{name}"], r = _timed(argv, tree)
        out[f"loop_{name}"] = _loop_s(r)
    for suffix, tree in trees.items():
        out[f"ratio{suffix}"] = out[f"traced{suffix}"] / out["untraced"]
        out[f"cpu_ratio{suffix}"] = out[f"cpu_traced{suffix}"] / out["cpu_untraced"]
        out[f"loop_ratio{suffix}"] = out[f"loop_traced{suffix}"] / out["loop_untraced"]
        directory = os.path.join(scratch, f"round{i}{suffix.strip(' ()')}")
        if not draw:
            out[f"events{suffix}"] = _count_events(directory, tree)
            shutil.rmtree(directory, ignore_errors=True)
            continue
        _, _, r = _timed([sys.executable, "-c", DRAW, directory], tree)
        draw = json.loads(r.stdout.strip().splitlines()[-1])
        parts = ("import_s", "timeline_s", "memory_map_s", "wait_for_s")
        draw["drawing_s"] = sum(draw[k] for k in parts)
        draw["cpu_drawing_s"] = sum(draw["cpu_" + k] for k in parts)
        out.update({f"{k}{suffix}": v for k, v in draw.items()})
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _count_events(directory, tree):
    """How many events the traced run recorded (read back by that tree's mpviz)."""
    _, _, r = _timed([sys.executable, "-c", "import sys, mpviz.trace as t; "
                      "print(len(t.load(sys.argv[1]).events))", directory], tree)
    return int(r.stdout.split()[-1])


def _median(rounds, key):
    values = [r[key] for r in rounds]
    return statistics.median(values), min(values), max(values)


def _table(rounds, suffix, args, span):
    """The two Markdown lines of one tree (`suffix`: "" or " (before)"/" (after)")."""
    ratio, untraced, traced = (_median(rounds, k + s) for k, s in
                               (("ratio", suffix), ("untraced", ""), ("traced", suffix)))
    what = (f"DataLoader, {args.workers} workers, {args.batches:,} batches "
            f"({rounds[0]['events' + suffix]:,} events){suffix}")
    cpu, loop = _median(rounds, "cpu_ratio" + suffix), _median(rounds, "loop_ratio" + suffix)
    print(f"| {what}: `mpviz trace` ÷ untraced, wall | {ratio[0]:.2f}× ({ratio[1]:.2f}–"
          f"{ratio[2]:.2f}×; {traced[0]:.1f} s vs {untraced[0]:.1f} s, min {traced[1]:.1f} s vs "
          f"{untraced[1]:.1f} s; the program's own loop "
          f"{loop[0]:.2f}×, CPU of all processes {cpu[0]:.2f}×), median of {span} | "
          f"goal ≤ {RATIO_GOAL}×: {'met' if ratio[0] <= RATIO_GOAL else 'MISSED'} |")
    if "drawing_s" + suffix not in rounds[0]:
        return                                   # (--no-draw)
    drawing, loading = _median(rounds, "drawing_s" + suffix), _median(rounds, "load_s" + suffix)
    drawing_cpu = _median(rounds, "cpu_drawing_s" + suffix)
    parts = {k: _median(rounds, k + suffix)[0] for k in ("import_s", "timeline_s",
                                                          "memory_map_s", "wait_for_s")}
    print(f"| {what}: drawing timeline + memory map + wait-for to PNG (import included; "
          f"reading the trace apart: {loading[0]:.1f} s) | {drawing[0]:.1f} s ({drawing[1]:.1f}–"
          f"{drawing[2]:.1f} s; " + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in parts.items())
          + f"; CPU {drawing_cpu[0]:.1f} s), median of {span} | goal ≤ {DRAW_GOAL_S:.0f} s: "
          f"{'met' if drawing[0] <= DRAW_GOAL_S else 'MISSED'} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 batches, 2 workers, 1 round")
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", metavar="DIR", help="another checkout, measured in turn")
    parser.add_argument("--no-draw", action="store_true",
                        help="time the runs only, not the pictures (a round takes half as long)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.workers, args.rounds = 200, 2, 1
    trees = ({" (before)": os.path.abspath(args.before), " (after)": ROOT} if args.before
             else {"": ROOT})
    scratch = tempfile.mkdtemp(prefix="mpviz-bench-dl-")
    load = [os.getloadavg()[0]]
    rounds = []
    try:
        for i in range(args.rounds):
            rounds.append(one_round(i, args.batches, args.workers, scratch, trees,
                                     draw=not args.no_draw))
            load.append(os.getloadavg()[0])
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1].items()
                                                 if not k.startswith("events")),
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    span = (f"{args.rounds} round{'s' * (args.rounds > 1)}, load average "
            f"{min(load):.1f}–{max(load):.1f}")
    for suffix in trees:
        _table(rounds, suffix, args, span)
    results = dict(machine=dict(python=platform.python_version(), cores=os.cpu_count(),
                                cpu=platform.processor() or platform.machine()),
                   batches=args.batches, workers=args.workers, trees=trees, rounds=rounds,
                   load_average=load, goals=dict(ratio=RATIO_GOAL, drawing_s=DRAW_GOAL_S))
    path = save_results(f"dataloader-trace-{'quick-' if args.quick else ''}"
                        f"{time.strftime('%Y%m%d-%H%M%S')}.json", results)
    print(f"written to {path}")
    return results


if __name__ == "__main__":
    main()
