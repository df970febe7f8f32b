"""The last rank loads the checkpoint and broadcasts it; the author writes src=world_size
for "the last rank" (ranks count from 0: the last one is world_size - 1)."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    weights = torch.zeros(4)
    if rank == world_size - 1:
        weights += 1.0                       # "loaded from the checkpoint"
    dist.broadcast(weights, src=world_size)
    print(f"rank {rank}: {weights.tolist()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
