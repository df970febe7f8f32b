"""Where a traced DataLoader run spends its CPU, thread by thread (issue #27, item 4).

Runs ``dataloader_program.py``'s loader untraced and under ``mpviz trace``, in turn, and at the
end of each process reads every thread's CPU time from /proc/self/task/TID/stat (user +
system), named by Python's thread names: the main process's thread, and in the workers
(summed over all of them) their main thread (fetch, collate), the Queue's feeder thread
(pickling each batch: torch's reduce_storage) and resource_sharer's ``_serve`` thread (hands each
tensor's fd to the main process). What tracing adds to each is where the traced time goes.

    PYTHONPATH=CHECKOUT python bench/dataloader_threads.py [batches=3000] [workers=8] [rounds=2]

A worker's counts are written by a ``multiprocessing.util.Finalize`` (run as the worker leaves
``_bootstrap``), the main process's after its loop; mpviz's own start-up in the program is
counted in the main thread (its import), its fork hooks in each worker's main thread.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROGRAM = r"""
import json, os, sys, threading
sys.path.insert(0, sys.argv[4])
from multiprocessing import util
from torch.utils.data import DataLoader
from dataloader_program import Rows

def cpu_by_thread(out):
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    # the process's own line counts the threads that have ended too (a Queue's feeder joined)
    for tid in ["self"] + os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/stat" if tid == "self" else f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue                     # (a thread that ended meanwhile)
        name = "all threads, ended ones too" if tid == "self" else \
            names.get(int(tid), "other").split(" (")[-1].rstrip(")")
        with open(out, "a") as f:
            f.write(json.dumps([name, (int(fields[11]) + int(fields[12])) / tick]) + "\n")

def init(worker_id):
    util.Finalize(None, cpu_by_thread, args=(sys.argv[3] + ".workers",), exitpriority=100)

loader = DataLoader(Rows(int(sys.argv[1]) * 4), batch_size=4, num_workers=int(sys.argv[2]),
                    worker_init_fn=init)
for x, y in loader:
    float(x.sum())
cpu_by_thread(sys.argv[3] + ".main")
"""


def _run(traced, batches, workers, directory, n):
    prog, out = os.path.join(directory, "prog.py"), os.path.join(directory, f"cpu{n}")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    argv = [sys.executable, prog, str(batches), str(workers), out, HERE]
    if traced:
        argv = [sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o",
                os.path.join(directory, f"trace{n}"), "--"] + argv
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, timeout=1800)
    totals = {}
    for side in ("main", "workers"):
        with open(f"{out}.{side}") as f:
            for line in f:
                name, cpu = json.loads(line)
                key = f"{side}: {name}"
                totals[key] = totals.get(key, 0.0) + cpu
    return totals


def main():
    given = [int(a) for a in sys.argv[1:4]]
    batches, workers, rounds = given + [3000, 8, 2][len(given):]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="mpviz-bench-threads-") as directory:
        for r in range(rounds):
            for traced in ((False, True) if r % 2 == 0 else (True, False)):
                got = _run(traced, batches, workers, directory, f"{r}{int(traced)}")
                for key, cpu in got.items():
                    rows.setdefault(key, ([], []))[int(traced)].append(cpu)
    print(f"CPU seconds by thread, {batches} batches, {workers} workers, {rounds} rounds, "
          f"min over rounds (load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M')})")
    print("| thread | untraced | traced | added, µs a batch |\n|---|---|---|---|")
    for key, (off, on) in sorted(rows.items()):
        if off and on:
            print(f"| {key} | {min(off):.2f} | {min(on):.2f} | "
                  f"{(min(on) - min(off)) / batches * 1e6:.0f} |")


if __name__ == "__main__":
    main()
