"""Rank 1 meets a bad sample in its second batch and raises; rank 0 goes on to all-reduce its
second loss, and waits there for rank 1."""
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
    for step in range(3):
        if rank == 1 and step == 1:
            raise ValueError(f"sample {step} of rank {rank} is corrupt")
        loss = torch.tensor([float(step + rank)])
        dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2, join=True)
