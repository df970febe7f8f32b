"""Ranks 1 and 2 form a group to evaluate; the author passes src=0 meaning "the group's first
rank", but torch wants the global rank (1): ranks 1 and 2 raise in broadcast #1 of group [1, 2],
and rank 0 waits for them in the barrier every rank calls next."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    evaluators = dist.new_group([1, 2])
    if rank in (1, 2):
        weights = torch.full((3,), float(rank))
        dist.broadcast(weights, src=0, group=evaluators)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(3,), nprocs=3, join=True)
