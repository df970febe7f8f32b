"""Rank 0 logs the mean loss at the end: the all_reduce sits inside `if rank == 0:`, so rank 1
never calls it -- it finishes and leaves."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    loss = torch.tensor([1.0 + rank])
    dist.all_reduce(loss)                       # collective #1: everyone
    if rank == 0:
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)                  # collective #2: rank 0 only
        print("mean loss", total.item() / world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2, join=True)
