"""Two processes are started, but each says the world has 3 ranks: init_process_group waits
for a third rank that never starts."""
import os
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 3                  # but only 2 processes below
    mp.spawn(train, args=(world_size,), nprocs=2, join=True)
