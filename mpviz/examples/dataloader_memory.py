"""Datasets for notebook 13's memory sections, as their authors would write them (plain torch).

    DecodedImages(n, mib, cache_items)  "decoding" an image is slow, so the dataset keeps every
                                        image it decoded in self.cache -- a dict that each
                                        DataLoader worker fills on its own, until a memory limit
                                        (a container's: a memory cgroup) kills the largest worker
    PathList(n, container)              the shape of pytorch issue 13246: a Python list of
                                        (path, label) tuples. Reading an item writes the
                                        refcounts of its objects, so each forked worker's
                                        copy-on-write pages get copied: its private memory grows
    PathArray(n)                        the fix: the same samples in two NumPy arrays (bytes and
                                        int64): reading them writes nothing of what fork shared
    announce(join, worker_id)           a worker_init_fn: print this worker's pid and, where
                                        `join` names a cgroup's cgroup.procs, move into it
The program is notebooks/programs/dataloader_memory.py; mpviz/examples/dataloader_watch.py runs
it and reads each worker's memory from /proc.
"""
import os
import sys
import time

import numpy as np

DECODE_SECONDS = 0.05          # a "decode" takes this long: the memory grows over a second or two


class DecodedImages:
    """`n` images of `mib` MiB; each decoded image is kept in self.cache (up to `cache_items`
    of them; None: all, 0: none)."""

    def __init__(self, n=64, mib=8, cache_items=None):
        self.n, self.mib, self.cache_items = n, mib, cache_items
        self.cache = {}

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        image = self.cache.get(index)
        if image is None:
            time.sleep(DECODE_SECONDS)
            image = np.full((self.mib << 20) // 4, index, dtype=np.float32)  # every page written
            if self.cache_items is None or len(self.cache) < self.cache_items:
                self.cache[index] = image
        return image[:16384].copy()          # a 64 KiB "crop" goes to the batch (collate stacks)


class PathList:
    """`n` samples as most datasets hold them: a list of (path, label) tuples (`container`:
    list, or tuple -- the same objects, in a container that cannot change)."""

    def __init__(self, n=1_000_000, container=list):
        self.samples = container((f"images/{i:08d}.jpg", i % 1000) for i in range(n))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]     # +1 on the tuple's, the str's refcount: a write
        return label                          # (a real dataset would open `path` here)


class PathArray:
    """The same `n` samples in NumPy arrays: paths as fixed-size bytes, labels as int64."""

    def __init__(self, n=1_000_000):
        self.paths = np.array([f"images/{i:08d}.jpg" for i in range(n)], dtype="S19")
        self.labels = np.arange(n, dtype=np.int64) % 1000

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        path = self.paths[index].decode()     # a new str, in this worker's own memory
        return int(self.labels[index])


def announce(join, worker_id):
    """worker_init_fn (with functools.partial): say which pid is this worker; with `join` (a
    cgroup.procs file), move into that memory cgroup -- it stands for the container's limit."""
    if join:
        with open(join, "w") as f:
            f.write(str(os.getpid()))         # from now on the kernel charges our pages there
    sys.stdout.flush()
    # one write() of the whole line: two workers' print()s may interleave on the shared pipe
    # (print writes the text and its "\n" apart: "worker 0 pid 11worker 1 pid 12\n\n" was seen)
    os.write(sys.stdout.fileno(), f"worker {worker_id} pid {os.getpid()}\n".encode())
