"""Notebook 13's memory programs: plain torch (mpviz/examples/dataloader_watch.py watches them).

Run one:  python dataloader_memory.py cache [--workers N] [--cache-items K] [--join FILE]
              one epoch of DecodedImages (64 images of 8 MiB, batch_size 4): each worker keeps
              what it decoded; --join: each worker moves into that cgroup.procs (a memory limit)
          python dataloader_memory.py list [--n N]     one epoch of PathList (a list of tuples)
          python dataloader_memory.py tuple [--n N]    the same in a tuple of tuples
          python dataloader_memory.py array [--n N]    the same samples in NumPy arrays
              (batch_size 1024, 2 workers; --gc-freeze: gc.freeze() before the workers start)
The datasets are in mpviz/examples/dataloader_memory.py. torch's DataLoader where torch is
installed; else (or with --mpviz) mpviz.utils.data.DataLoader, which follows torch's semantics.
"""
import argparse
import functools
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from mpviz.examples.dataloader_memory import (DecodedImages, PathArray, PathList,  # noqa: E402
                                              announce)


def resident():
    """This process's resident memory in bytes (VmRSS)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["cache", "list", "tuple", "array"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-items", type=int, default=None)
    parser.add_argument("--join", default=None)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--gc-freeze", action="store_true")
    parser.add_argument("--mpviz", action="store_true", help="mpviz's DataLoader, not torch's")
    args = parser.parse_args(argv)
    try:
        if args.mpviz:
            raise ImportError("--mpviz")
        import torch
        from torch.utils.data import DataLoader
        print(f"DataLoader: torch {torch.__version__}'s", flush=True)
    except ImportError as exc:
        from mpviz.utils.data import DataLoader
        print(f"DataLoader: mpviz.utils.data's ({'asked for' if args.mpviz else exc})",
              flush=True)
    before = resident()
    if args.what == "cache":
        dataset, batch_size = DecodedImages(cache_items=args.cache_items), 4
    elif args.what == "array":
        dataset, batch_size = PathArray(args.n), 1024
    else:
        dataset, batch_size = PathList(args.n, {"list": list, "tuple": tuple}[args.what]), 1024
    print(f"dataset made: +{(resident() - before) / 2**20:.0f} MiB resident in the main process",
          flush=True)
    if args.gc_freeze:
        gc.freeze()         # move every object to the GC's permanent generation, never scanned
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=args.workers,
                        worker_init_fn=functools.partial(announce, args.join))
    batches = sum(1 for _ in loader)
    print(f"epoch done: {batches} batches", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
