"""Two ranks train on shards of different lengths: rank 0 has 3 batches, rank 1 has 2. Each
batch all-reduces the loss; after its loop each rank waits at a barrier -- so rank 0's third
all_reduce meets rank 1's barrier (collective #3 of each)."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size, shards):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    for batch in shards[rank]:
        loss = torch.tensor([float(sum(batch))])
        dist.all_reduce(loss)
        loss /= world_size
    dist.barrier()                  # everyone done with the epoch
    dist.destroy_process_group()


if __name__ == "__main__":
    shards = [[[1, 2], [3, 4], [5, 6]],       # rank 0: 3 batches
              [[7, 8], [9, 10]]]              # rank 1: 2 batches
    mp.spawn(train, args=(2, shards), nprocs=2, join=True)
