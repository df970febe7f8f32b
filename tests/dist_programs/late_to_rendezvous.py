"""Each rank builds its part of the dataset before joining the group; rank 1's part takes
longer (a few seconds of CPU)."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def build_dataset(rank):
    torch.set_num_threads(1)
    a = torch.randn(200, 200)
    end = time.monotonic() + (float(os.environ.get("BUILD_SECONDS", 5)) if rank == 1 else 0.1)
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
    return a


def run(rank, size):
    data = build_dataset(rank)
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ.setdefault('MASTER_PORT', '29500')
    dist.init_process_group("gloo", rank=rank, world_size=size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    t = data.sum().reshape(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print(rank, "done")


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
