"""Rank 1 loads its second batch from a slow disk: the others wait for it in all_reduce #2.
Slow, not stuck: it comes (after the sleep)."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def load_batch(rank, step):
    if rank == 1 and step == 1:
        time.sleep(float(os.environ.get("SLOW_LOAD", 60)))     # the slow disk
    return torch.full((4,), float(step))


def train(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    for step in range(3):
        grads = load_batch(rank, step)
        dist.all_reduce(grads)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2, join=True)
