"""DDP training; each rank's DataLoader reads its own shard, and rank 1's shard is shorter
(3 batches, rank 0's 4): rank 1 goes on to the barrier while rank 0, in its 4th backward(),
all-reduces its gradients inside DDP's Reducer (C++) -- for a rank that never joins."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def train(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    n = 64 if rank == 0 else 48
    data = TensorDataset(torch.randn(n, 10), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=16)
    model = DDP(nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    dist.barrier()                  # wait for everyone before saving
    print(f"rank {rank} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(train, args=(2,), nprocs=2, join=True)
