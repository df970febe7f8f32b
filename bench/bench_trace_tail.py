"""What the ``mpviz trace`` launcher does after the program ends, on one finished trace (#27).

The launcher's tail: read the logs to their end (``load``: what ``Trace.refresh(final=True)``
does), build the Chrome events and write trace.json, let the trace go. Each is run in a fresh
interpreter on a copy of the same logs, this checkout and ``--before DIR`` in turn (``--rounds``
pairs, the order turning each round); wall time and the CPU of the process and of any children
it forked (the launcher of 2026-11-28 encoded parts of trace.json in forked children: a
`--before` of it counts them). trace.json's md5 is printed: both must write the same bytes.

    python bench/bench_trace_tail.py TRACE_DIR [--before DIR] [--rounds 5]
    python bench/bench_trace_tail.py --quick     # a smoke run (python -m bench --quick): one
                                                 # round on a small trace it records first

TRACE_DIR: a finished ``mpviz trace -o`` directory (e.g. of bench/dataloader_program.py).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Run in a fresh interpreter: prints one JSON line.
TAIL = r"""
import hashlib, json, os, resource, sys, time
from mpviz.trace import launcher, load
from mpviz.trace.trace import without_gc

def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime

d = sys.argv[1]
out = {}
with without_gc():
    t, c = time.perf_counter(), cpu(resource.RUSAGE_SELF)
    trace = load(d)
    out["read_s"], out["cpu_read_s"] = time.perf_counter() - t, cpu(resource.RUSAGE_SELF) - c
    t, c, k = time.perf_counter(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    if hasattr(launcher, "_write_trace_json"):
        path = launcher._write_trace_json(d, trace)
    else:                                       # (the launcher before 2026-11-28)
        path = launcher._write_private(d, "trace.json",
                                       lambda f: launcher._json_into(f, trace.to_chrome()))
    out["json_s"] = time.perf_counter() - t
    out["cpu_json_s"] = cpu(resource.RUSAGE_SELF) - c
    out["cpu_json_children_s"] = cpu(resource.RUSAGE_CHILDREN) - k
    t, c = time.perf_counter(), cpu(resource.RUSAGE_SELF)
    del trace
    out["free_s"], out["cpu_free_s"] = time.perf_counter() - t, cpu(resource.RUSAGE_SELF) - c
out["md5"] = hashlib.md5(open(path, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def one(tree, logs):
    scratch = tempfile.mkdtemp(prefix="mpviz-bench-tail-")
    try:
        for f in os.listdir(logs):
            if f.endswith(".mpvlog") or f == "notes.txt":
                shutil.copy(os.path.join(logs, f), scratch)
        env = dict(os.environ, PYTHONPATH=tree)
        r = subprocess.run([sys.executable, "-c", TAIL, scratch], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"{tree}: {r.stderr[-2000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["tail_s"] = out["read_s"] + out["json_s"] + out["free_s"]
        out["cpu_tail_s"] = (out["cpu_read_s"] + out["cpu_json_s"] + out["cpu_free_s"]
                             + out["cpu_json_children_s"])
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --quick's program: 500 messages each way between two processes (a few thousand events)
SMALL_PROGRAM = """
import multiprocessing as mp

def echo(requests, replies):
    for _ in range(500):
        replies.put(requests.get())

if __name__ == "__main__":
    requests, replies = mp.Queue(), mp.Queue()
    p = mp.Process(target=echo, args=(requests, replies))
    p.start()
    for i in range(500):
        requests.put(i)
        replies.get()
    p.join()
"""


def record_small_trace(scratch):
    """A finished trace directory of SMALL_PROGRAM, recorded by this checkout in `scratch`."""
    program, directory = os.path.join(scratch, "echo.py"), os.path.join(scratch, "trace")
    with open(program, "w") as f:
        f.write(SMALL_PROGRAM)
    r = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", directory,
                        "--", sys.executable, program], cwd=scratch, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    if r.returncode != 0:
        raise SystemExit(f"recording the small trace failed ({r.returncode}): {r.stderr[-2000:]}")
    return directory


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir", nargs="?")
    parser.add_argument("--before", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="one round; without TRACE_DIR, on a small trace recorded first")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
        if args.trace_dir is None:
            with tempfile.TemporaryDirectory(prefix="mpviz-bench-tail-") as scratch:
                args.trace_dir = record_small_trace(scratch)
                return measure(args)
    if args.trace_dir is None:
        parser.error("TRACE_DIR is needed: a finished `mpviz trace -o DIR` directory (e.g. of "
                     "bench/dataloader_program.py); or --quick, which records a small one")
    return measure(args)


def measure(args):
    trees = {"after": ROOT}
    if args.before:
        trees = {"before": os.path.abspath(args.before), "after": ROOT}
    runs = {name: [] for name in trees}
    load = [os.getloadavg()[0]]
    for i in range(args.rounds):
        names = list(trees)
        for name in names[i % len(names):] + names[:i % len(names)]:
            runs[name].append(one(trees[name], args.trace_dir))
        load.append(os.getloadavg()[0])
        print(f"round {i + 1}: " + "; ".join(
            f"{n} wall {r[-1]['tail_s']:.2f} s CPU {r[-1]['cpu_tail_s']:.2f} s"
            for n, r in runs.items()), file=sys.stderr, flush=True)
    print(f"{args.rounds} rounds, load average {min(load):.1f}–{max(load):.1f}; min, median:")
    keys = ("tail_s", "read_s", "json_s", "free_s", "cpu_tail_s", "cpu_json_s",
            "cpu_json_children_s")
    for name, rs in runs.items():
        parts = ", ".join(f"{k} {min(r[k] for r in rs):.2f}/"
                          f"{statistics.median(r[k] for r in rs):.2f}" for k in keys)
        print(f"{name}: {parts}; md5 {sorted({r['md5'] for r in rs})}")
    print("| tree | tail wall, min (s) | read | trace.json | free | tail CPU, min (s) |")
    print("|---|---|---|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | " + " | ".join(f"{min(r[k] for r in rs):.3f}" for k in
                                         ("tail_s", "read_s", "json_s", "free_s", "cpu_tail_s"))
              + " |")


if __name__ == "__main__":
    main()
