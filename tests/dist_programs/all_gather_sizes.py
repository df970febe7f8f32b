"""Each rank gathers the predictions of its last batch from the others: rank 1's last batch
is smaller (3 predictions, rank 0's 5), and all_gather needs equal sizes."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    preds = torch.arange(5.0) if rank == 0 else torch.arange(3.0)
    gathered = [torch.zeros_like(preds) for _ in range(world_size)]
    dist.all_gather(gathered, preds)
    print(rank, [g.tolist() for g in gathered])
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
