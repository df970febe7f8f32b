"""oversubscription: workers × math threads per worker > cores.

What happens: a numerical library runs each big operation on a pool of threads, one per core by
default (torch's intra-op threads, OpenMP; here NumPy's OpenBLAS). Every worker process has its
own pool. With M workers on N cores that is M × N threads for N cores: they take turns, each
thread's share of the caches is evicted by the others, and threads that spin while waiting for
their siblings burn the cores the others need. The job runs slower than with fewer threads, and
nothing reports an error::

    2 cores, 4 workers, default threads     4 × 2 = 8 threads on 2 cores   oversubscribed
    2 cores, 4 workers, threads=1           4 × 1 = 4 threads ... still > 2, but each worker
                                             keeps one core busy without waiting on siblings

The fix (torch's notes on Hogwild): give each worker ``cores // workers`` threads, at least 1 --
``torch.set_num_threads(n)`` in the worker, or ``OMP_NUM_THREADS`` in its environment. Here the
workers are spawned with ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to ``threads``
(0: not set, the library's default). Each worker does the same matrix products and reports its
own threads (``/proc/self/status``) and seconds. The verdict counts threads against the cores
this run may use (``os.sched_getaffinity``) and reports the time measured: the time depends on
what else the machine runs, the count does not.
"""
import os
import time

from ._common import check_between, context, get, step
from .base import Param

SUMMARY = "workers × math threads > cores: oversubscribed; threads = cores // workers"
PARAMS = {
    "workers": Param(4, None, "worker processes"),
    "threads": Param(0, None, "math threads per worker (OMP_NUM_THREADS); 0: library default"),
    "size": Param(300, None, "n of the n × n matrix products each worker computes"),
    "products": Param(20, None, "matrix products per worker"),
}
ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
REPORTS_S = 55.0          # every worker reports within this, or the run fails saying so


def check_params(p):
    check_between(p, "workers", 1, 8)
    check_between(p, "threads", 0, 16)
    check_between(p, "size", 50, 600)
    check_between(p, "products", 1, 200)


def _threads():
    with open("/proc/self/status") as f:
        return int(f.read().split("Threads:")[1].split()[0])


def worker(rank, size, products, out):
    import numpy as np
    a = np.full((size, size), 1.0 / size)
    a @ a                                         # the library starts its thread pool now
    threads = _threads()
    start = time.perf_counter()
    for i in range(products):
        a @ a
        if i % 10 == 9:
            step("products done", rank=rank, done=i + 1)
    out.put((rank, threads, round(time.perf_counter() - start, 3)))


def drive(p, details):
    if p["threads"]:
        for name in ENV:                          # spawn children read it when numpy loads
            os.environ[name] = str(p["threads"])
    else:
        for name in ENV:
            os.environ.pop(name, None)
    ctx = context({"start_method": "spawn"})      # fresh interpreters: the setting applies
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(rank, p["size"], p["products"], out),
                         name=f"worker-{rank}") for rank in range(p["workers"])]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    # (one deadline for all the reports: 4 spawned interpreters importing NumPy and computing
    # on a loaded 2-core machine took more than 25 s, a CI run's notebook 11)
    deadline = time.monotonic() + REPORTS_S
    reports = sorted(get(out, timeout=max(1.0, deadline - time.monotonic()),
                         what="a worker's report") for _ in procs)
    for proc in procs:
        proc.join()
    details["wall_s"] = round(time.perf_counter() - start, 3)
    details["cores"] = len(os.sched_getaffinity(0))
    details["threads"] = [r[1] for r in reports]
    details["compute_s"] = [r[2] for r in reports]
    step("workers done", threads=details["threads"], compute_s=details["compute_s"])


def verdict(t, details):
    prm = details["params"]
    cores, threads = details["cores"], details["threads"]
    total = sum(threads)
    timing = (f"Each worker's {prm['products']} products of {prm['size']} × {prm['size']} took "
              f"{min(details['compute_s']):.2f} to {max(details['compute_s']):.2f} s (measured "
              f"now: it depends on what else this machine runs).")
    setting = (f"threads={prm['threads']}" if prm["threads"] else "the library's default")
    head = (f"{prm['workers']} workers with {setting} ran {threads} threads each (the main "
            f"thread included), {total} in all, on {cores} core(s). ")
    pools = any(n > 1 for n in threads)       # a worker whose library started a thread pool
    if pools and total > cores:
        return "warning", head + (
            f"Every worker's math library started its own pool of threads: the workers compete "
            f"for the cores with {total} threads, oversubscribed. " + timing +
            f" Fix: give each worker cores // workers threads, at least 1: "
            f"torch.set_num_threads({max(1, cores // prm['workers'])}) in the worker, or "
            f"OMP_NUM_THREADS={max(1, cores // prm['workers'])} "
            f"(threads={max(1, cores // prm['workers'])}); or run fewer workers.")
    return "ok", head + (
        "No worker started a pool of math threads beyond its own main thread, so nothing waits "
        "on sibling threads" + (f"; {prm['workers']} workers still share {cores} core(s), "
                                 f"taking turns" if prm["workers"] > cores else "") + ". " + timing)
