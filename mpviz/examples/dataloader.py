"""Datasets for notebook 13 (DataLoader workers), as their authors would write them.

They are plain map-style datasets (``__len__`` and ``__getitem__``), which is all
``torch.utils.data.DataLoader`` asks of one, so this module imports without torch; torch is
imported inside ``__getitem__``, in the worker, when a DataLoader runs them. The notebook runs
them through ``notebooks/programs/dataloader_lesson.py`` under ``python -m mpviz trace``, so the
kernel itself forks no worker.

    Images(n, kib)          n "images" of `kib` KiB each; every item says which worker made it
    Augmented(n)            a random "crop offset" per item, from two sources of randomness:
                              np.random.randint   NumPy's global generator: torch 2.13 reseeds it
                                                  in every worker (worker.py: np.random.seed)
                              self.rng.integers   a Generator made in __init__, in the main
                                                  process: every forked worker gets a copy of it
                                                  in the same state -> the same "random" numbers
    seed_worker(worker_id)  the fix, a worker_init_fn: a Generator of its own per worker, seeded
                            from worker_info.seed (torch's base_seed + worker id, new each epoch)
"""
import os

import numpy as np


def _worker_id():
    from torch.utils.data import get_worker_info
    info = get_worker_info()
    return -1 if info is None else info.id        # -1: the main process (num_workers=0)


class Images:
    """`n` images of `kib` KiB (float32), image i filled with i; each item also names its worker."""

    def __init__(self, n=12, kib=256):
        self.n, self.kib = n, kib

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        import torch
        image = torch.full((self.kib * 256,), float(index))        # 256 float32 = 1 KiB
        return {"image": image, "worker": _worker_id(), "pid": os.getpid()}


class Augmented:
    """`n` items, each with a random crop offset (0..999) from both of NumPy's generators."""

    def __init__(self, n=4):
        self.n = n
        self.rng = np.random.default_rng()      # made here, in the main process, before the fork

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return {"index": index, "worker": _worker_id(),
                "global_np": int(np.random.randint(0, 1000)),   # np.random: reseeded per worker
                "own_rng": int(self.rng.integers(0, 1000))}     # self.rng: copied into each worker


def seed_worker(worker_id):
    """worker_init_fn: give this worker's copy of the dataset a Generator of its own, seeded from
    torch's per-worker seed (base_seed + worker_id; base_seed is drawn anew for every epoch)."""
    from torch.utils.data import get_worker_info
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)
