"""DistributedSampler: which samples of a data set each rank reads, epoch by epoch.

    10 samples, 3 ranks, shuffle=True, seed 0, epoch 0:
        the permutation of 0..9 drawn from seed + epoch     4 1 7 5 3 9 0 8 6 2
        padded to a multiple of 3 (the start repeated)      4 1 7 5 3 9 0 8 6 2 4 1
        rank r takes every 3rd, from r:   rank 0: 4 5 0 2   rank 1: 1 3 8 4   rank 2: 7 9 6 1

Every rank draws the *same* permutation (same seed, same epoch) and keeps its own stride of it,
so the ranks' parts never overlap and together cover the data set. Call ``set_epoch(e)`` at the
start of each epoch: without it, the epoch stays 0 and every epoch reads the same order.

The permutation is torch's, bit for bit: ``torch.randperm(n, generator=manual_seed(seed +
epoch))`` is a Fisher-Yates shuffle driven by a Mersenne Twister (mt19937), which NumPy's legacy
``RandomState`` also is -- so the same seed gives a torch program and an mpviz one the same
samples (tests/test_distributed.py checks it against torch). Adapted from torch's
``utils/data/distributed.py``; left out: data sets of more than 2**32 / 20 samples (torch then
draws 64-bit numbers).
"""
import math

import numpy as np

from ... import distributed as dist


def randperm(n, seed):
    """torch.randperm(n) from a generator seeded with `seed`: Fisher-Yates on mt19937's words."""
    words = np.random.RandomState(seed & 0xFFFFFFFF).randint(0, 2 ** 32, size=max(n - 1, 0),
                                                             dtype=np.uint64)
    order = list(range(n))
    for i in range(n - 1):
        j = i + int(words[i]) % (n - i)
        order[i], order[j] = order[j], order[i]
    return order


class DistributedSampler:
    """The indices of `dataset` that rank `rank` of `num_replicas` reads this epoch."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        if num_replicas is None:
            num_replicas = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank()
        if not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]. Fix: rank=dist.get_rank() and "
                             f"num_replicas=dist.get_world_size(), or leave both out after "
                             f"init_process_group.")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)  # drop the tail
        else:
            self.num_samples = math.ceil(n / num_replicas)                   # pad to equal parts
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        indices = randperm(n, self.seed + self.epoch) if self.shuffle else list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            indices += (indices * math.ceil(padding / len(indices)))[:padding] if padding else []
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Draw the next epoch's order: every rank must call it with the same `epoch`."""
        self.epoch = epoch
