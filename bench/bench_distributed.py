"""all_reduce on one machine: mpviz.distributed's ring (shared memory) against torch's gloo (TCP).

    python bench/bench_distributed.py            # full run: 4 KiB, 1 MiB, 64 MiB; 2 and 4 ranks
    python bench/bench_distributed.py --quick    # a smoke run: 4 KiB and 1 MiB, 2 ranks

Side by side in one run, in the *same* processes: each rank joins a torch.distributed group
(backend gloo) and an mpviz.distributed group at once, and the contenders take turns, one batch
each, round after round -- so a burst of load from elsewhere on the machine hits all of them:

    gloo             torch.distributed.all_reduce of a float32 torch tensor
    mpviz            mpviz.distributed.all_reduce of a float32 mpviz tensor, recorder off
    mpviz recorded   the same, with mpviz's recorder on (events dist.collective, dist.ring_step)

A batch: a barrier, then ``reps`` all_reduces timed by rank 0 (``time.perf_counter``); per op =
batch time / reps. Reported: the median over rounds, and the ratio to gloo (< 1: mpviz faster).
BLAS and torch threads are pinned to 1 per rank. With 4 ranks on a 2-core machine the ranks take
turns on the cores: both contenders pay that, and the numbers say more about scheduling than
about the algorithm. Writes ``bench/results/bench_distributed.json`` and prints a Markdown table.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy and torch load their thread pools; ranks inherit it

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpviz  # noqa: E402
import mpviz.distributed as mdist  # noqa: E402
import mpviz.multiprocessing as mp  # noqa: E402
from mpviz.trace import recorder  # noqa: E402

from bench.run import human, save_results  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
CONTENDERS = ["gloo", "mpviz", "mpviz recorded"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world_size, ports, plan, rounds, trace_dir, results):
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank,
                             world_size=world_size, timeout=timeout)
    mdist.init_process_group("mpviz", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank,
                             world_size=world_size, timeout=timeout)
    times = {}
    for nbytes, reps in plan:
        n = nbytes // 4
        tensors = {"gloo": torch.zeros(n), "mpviz": mpviz.zeros(n)}   # sums stay finite
        for who in ("gloo", "mpviz"):                 # warm up: buffers grown, pages touched
            for _ in range(2):
                (tdist if who == "gloo" else mdist).all_reduce(tensors[who])
        for _ in range(rounds):
            for who in CONTENDERS:
                lib = tdist if who == "gloo" else mdist
                t = tensors["gloo" if who == "gloo" else "mpviz"]
                if who == "mpviz recorded":
                    recorder.start(trace_dir, "record")
                lib.barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    lib.all_reduce(t)
                elapsed = (time.perf_counter() - start) / reps
                if who == "mpviz recorded":
                    recorder.stop()
                times.setdefault(f"{who}|{nbytes}", []).append(elapsed)
    mdist.destroy_process_group()
    tdist.destroy_process_group()
    if rank == 0:
        results.put(times)


def measure(world_size, plan, rounds):
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="mpviz-bench-dist-") as trace_dir:
        ports = (_free_port(), _free_port())
        mp.spawn(rank_main, args=(world_size, ports, plan, rounds, trace_dir, results),
                 nprocs=world_size)
        return results.get()


def fmt(seconds):
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    if opts.quick:
        worlds, plan, rounds = [2], [(4 * KiB, 10), (1 * MiB, 3)], 1
    else:
        worlds, plan, rounds = [2, 4], [(4 * KiB, 200), (1 * MiB, 40), (64 * MiB, 3)], 9
    load_before = os.getloadavg()[0]
    rows, data = [], {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "load_before": load_before, "rounds": rounds, "results": []}
    for world_size in worlds:
        times = measure(world_size, plan, rounds)
        for nbytes, reps in plan:
            med = {who: statistics.median(times[f"{who}|{nbytes}"]) for who in CONTENDERS}
            data["results"].append({"ranks": world_size, "nbytes": nbytes, "reps": reps,
                                    "median_s": med})
            rows.append(f"| {world_size} | {human(nbytes)} | {fmt(med['gloo'])} | "
                        f"{fmt(med['mpviz'])} | {med['mpviz'] / med['gloo']:.2f}× | "
                        f"{fmt(med['mpviz recorded'])} | "
                        f"{med['mpviz recorded'] / med['mpviz']:.2f}× |")
    data["load_after"] = os.getloadavg()[0]
    save_results("bench_distributed.json", data)
    print(f"\nall_reduce, float32, one machine ({os.cpu_count()} CPUs, load {load_before:.1f} → "
          f"{data['load_after']:.1f}; median of {rounds} rounds)\n")
    print("| ranks | size | torch gloo | mpviz | mpviz ÷ gloo | mpviz recorded | recorded ÷ off |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
