"""Data-parallel training by hand, as torch's tutorial "Writing Distributed Applications" does
it: after backward() each rank averages its gradients with all_reduce, and at the end of the
epoch it averages its loss for the log. Each rank trains on its slice of 9 samples (rank 0: 5,
rank 1: 4) in batches of 2: rank 0 takes 3 steps, rank 1 takes 2 -- so rank 1's epoch-loss
all_reduce (4 bytes) meets rank 0's 3rd gradient all_reduce (16 bytes) as collective #5."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    torch.manual_seed(0)
    xs, ys = torch.randn(9, 4), torch.randn(9, 1)
    mine = list(range(rank, 9, size))
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    epoch_loss = torch.zeros(1)
    for start in range(0, len(mine), 2):
        batch = mine[start:start + 2]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xs[batch]), ys[batch])
        loss.backward()
        average_gradients(model)
        optimizer.step()
        epoch_loss += loss.detach()
    dist.all_reduce(epoch_loss)
    print(f"rank {rank}: epoch loss {epoch_loss.item() / size:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
