"""Hogwild throughput: training samples per second with 1 and with 2 worker processes.

    python bench/bench_hogwild.py            # full run (~30 s)
    python bench/bench_hogwild.py --quick    # a smoke run (~5 s)

Every worker trains the *same* shared model (``model.share_memory()``), as in torch's Hogwild
example, on its own shuffled copy of a synthetic data set. Each worker first builds its data and
optimizer, then waits at a barrier, so process start-up is not timed; it then runs ``--steps``
steps and reports when it started and stopped (``time.monotonic()``: one clock for all processes).
Throughput = all samples / (last stop − first start).

Ideally 2 workers on 2 idle cores do 2× the samples of one. What costs: the cores share the
parameters' cache lines (every ``step()`` writes them), and anything else running on the machine.
BLAS threads are pinned to 1 per process (set below, before NumPy is imported) so that two
workers do not fight over cores with their own thread pools. The load average before and after
is recorded: a loaded machine makes the ratio meaningless, and the table says so.

Each run is repeated, and a reference run trains a private model per worker (nothing shared):
its speed-up is what the machine allows; the gap to it is the cost of sharing.

Writes ``bench/results/bench_hogwild.json`` and prints a Markdown table.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy loads its BLAS; children inherit the environment

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import mpviz  # noqa: E402
import mpviz.multiprocessing as mp  # noqa: E402
from mpviz import nn, optim  # noqa: E402
from mpviz.examples import MyModel, accuracy, data_loader, make_blobs  # noqa: E402

from bench.run import save_results  # noqa: E402


def worker(model, rank, steps, batch_size, barrier, results, sizes=None):
    if model is None:  # the reference run: a private model per worker, nothing shared
        model = MyModel(*sizes)
    data, labels = make_blobs(4096, n_features=model.fc1.in_features,
                              n_classes=model.fc2.out_features, seed=0)
    epochs = steps * batch_size // len(data) + 1
    loader = data_loader(data, labels, batch_size, seed=rank, epochs=epochs)
    optimizer = optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.functional.cross_entropy
    batches = [next(loader) for _ in range(steps)]  # built before the clock starts
    barrier.wait()
    start = time.monotonic()
    for data, labels in batches:
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()  # in place, into shared memory
    results.put((rank, start, time.monotonic(), steps * batch_size))


def run(n_workers, args, ctx, shared=True):
    mpviz.manual_seed(0)
    sizes = (args.features, args.hidden, args.classes)
    model = MyModel(*sizes).share_memory()
    barrier, results = ctx.Barrier(n_workers), ctx.Queue()
    processes = [ctx.Process(target=worker, args=(model if shared else None, rank, args.steps,
                                                  args.batch, barrier, results, sizes))
                 for rank in range(n_workers)]
    for p in processes:
        p.start()
    reports = [results.get(timeout=300) for _ in processes]
    for p in processes:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{p.name} exited with {p.exitcode}")
    first = min(r[1] for r in reports)
    last = max(r[2] for r in reports)
    samples = sum(r[3] for r in reports)
    test = make_blobs(1000, n_features=args.features, n_classes=args.classes, seed=1)
    return samples / (last - first), accuracy(model, *test) if shared else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (a smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="steps per worker (default 1500, quick 300)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per worker count (default 5, quick 2)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--start-method", default="fork", choices=mp.get_all_start_methods())
    args = parser.parse_args()
    args.steps = args.steps or (300 if args.quick else 1500)
    args.repeats = args.repeats or (2 if args.quick else 5)
    ctx = mp.get_context(args.start_method)

    load_before = os.getloadavg()
    rows, private = {}, {}
    for n_workers in (1, 2):
        rates, accs, refs = [], [], []
        for _ in range(args.repeats):  # interleaved, so a burst of outside load hits both alike
            rate, acc = run(n_workers, args, ctx)
            rates.append(rate)
            accs.append(acc)
            refs.append(run(n_workers, args, ctx, shared=False)[0])
        rows[n_workers] = {"samples_per_s": rates, "median": statistics.median(rates),
                           "best": max(rates), "accuracy": accs}
        private[n_workers] = {"samples_per_s": refs, "median": statistics.median(refs), "best": max(refs)}
    load_after = os.getloadavg()

    ratio_median = rows[2]["median"] / rows[1]["median"]
    ratio_best = rows[2]["best"] / rows[1]["best"]
    cores = os.cpu_count()
    loaded = load_before[0] > 0.5 or load_after[0] > 2.5  # idle before; ~2 of our own while running
    result = {
        "benchmark": "hogwild", "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": args.quick,
        "python": platform.python_version(), "numpy": np.__version__, "cpu_count": cores,
        "start_method": args.start_method, "steps_per_worker": args.steps, "batch_size": args.batch,
        "model": f"{args.features}-{args.hidden}-{args.classes} MLP", "repeats": args.repeats,
        "workers": {str(k): v for k, v in rows.items()},
        "speedup_2_vs_1": {"median": ratio_median, "best": ratio_best}, "goal": 1.7,
        "private_reference": {str(k): v for k, v in private.items()},
        "private_speedup_2_vs_1": private[2]["median"] / private[1]["median"],
        "loadavg_before": load_before, "loadavg_after": load_after, "machine_loaded": loaded,
    }
    path = save_results("bench_hogwild.json", result)

    print(f"Hogwild, {result['model']}, batch {args.batch}, {args.steps} steps/worker, "
          f"{args.start_method}, {cores} CPUs, {args.repeats} runs each\n")
    print("| workers | samples/s (median) | samples/s (best) | speed-up (median) | accuracy |")
    print("|---|---|---|---|---|")
    for n, row in rows.items():
        speedup = row["median"] / rows[1]["median"]
        print(f"| {n} | {row['median']:,.0f} | {row['best']:,.0f} | {speedup:.2f}× | "
              f"{min(row['accuracy']):.1%}–{max(row['accuracy']):.1%} |")
    for n, row in private.items():
        speedup = row["median"] / private[1]["median"]
        print(f"| {n} private (reference) | {row['median']:,.0f} | {row['best']:,.0f} | {speedup:.2f}× | — |")
    verdict = "meets" if ratio_median >= 1.7 else "misses"
    print(f"\n2 workers vs 1: {ratio_median:.2f}× (median), {ratio_best:.2f}× (best) — {verdict} the 1.7× goal.")
    print(f"Reference without sharing (each worker its own model): "
          f"{result['private_speedup_2_vs_1']:.2f}× — the most 2 cores gave this run.")
    print(f"Load average before {load_before[0]:.2f}, after {load_after[0]:.2f}"
          + (" — the machine was busy with other work: treat the ratio as a lower bound." if loaded else "."))
    print(f"Results: {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
