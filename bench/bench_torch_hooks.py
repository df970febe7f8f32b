"""What recording costs per DataLoader batch on torch's sharing path, in one process (#27).

A batch as a DataLoader worker makes it (collate's ``stack`` into a new shared segment, a label
tensor), pickled with ``ForkingPickler.dumps`` (the sender: torch's reduce_storage, the fds put
on offer by resource_sharer) and unpickled again (the receiver: the fds fetched from this
process's resource_sharer, the storages rebuilt). CPU time per batch (all threads: the
resource_sharer's _serve thread works for both), recording off (the torch hooks installed, one
check each) and on (``mpviz.trace.record``), in turn, 5 times.

    PYTHONPATH=CHECKOUT python bench/bench_torch_hooks.py [batches=2000]
"""
import os
import pickle
import statistics
import sys
import tempfile
import time

import torch
from multiprocessing.reduction import ForkingPickler

import mpviz.trace as mt

ROWS = torch.arange(400, dtype=torch.float32).reshape(100, 4)


def batch(i):
    """4 rows stacked into a new shared segment (what collate does in a worker), and labels."""
    samples = [ROWS[(4 * i + k) % 100] for k in range(4)]
    storage = samples[0]._typed_storage()._new_shared(16, device="cpu")
    out = samples[0].new(storage).resize_(4, 4)
    return torch.stack(samples, 0, out=out), torch.tensor([1, 2, 3, 4])


def loop(n):
    """(sender, receiver) CPU µs per batch; the last 16 batches are kept, as a loader's are."""
    send = recv = 0.0
    keep = []
    for i in range(n):
        t0 = time.process_time()
        data = ForkingPickler.dumps(batch(i))
        t1 = time.process_time()
        keep.append(pickle.loads(data))
        t2 = time.process_time()
        send, recv = send + t1 - t0, recv + t2 - t1
        if len(keep) > 16:
            keep.pop(0)
    return send / n * 1e6, recv / n * 1e6


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    loop(200)
    res = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="mpviz-bench-hooks-") as directory:
        for r in range(5):
            res["off"].append(loop(n))
            with mt.record(os.path.join(directory, str(r)), hang_after=None):
                res["on"].append(loop(n))
    for k, v in res.items():
        s, r = [a for a, _ in v], [b for _, b in v]
        print(f"recording {k}: send min {min(s):.1f} median {statistics.median(s):.1f} µs; "
              f"receive min {min(r):.1f} median {statistics.median(r):.1f} µs (load "
              f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
