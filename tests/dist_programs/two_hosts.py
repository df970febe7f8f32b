"""One "host" of a 4-rank job, as a class runs it on two machines: each machine starts its own
ranks (here with mp.spawn, as torchrun would) and all meet at MASTER_ADDR:MASTER_PORT.

    python two_hosts.py NODE_RANK LIBRARY MODE      (NODE_RANK 0: ranks 0, 1;  1: ranks 2, 3;
                                                     all: the four ranks on this one host)

LIBRARY: torch (torch.distributed, gloo) or mpviz (mpviz.distributed). MODE: "train" -- three
all_reduces of a loss, a barrier; "uneven" -- node 0's ranks have 3 batches, node 1's 2, so
ranks 0 and 1 call all_reduce #3 while ranks 2 and 3 call barrier #3 (they disagree)."""
import importlib
import os
import sys
from datetime import timedelta

import torch
import torch.multiprocessing as mp

NPROC_PER_NODE, NNODES = 2, 2


def train(local_rank, first_rank, library, mode):
    dist = importlib.import_module(f"{library}.distributed")
    rank = first_rank + local_rank
    node_rank = rank // NPROC_PER_NODE
    world_size = NPROC_PER_NODE * NNODES
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    batches = 3 if mode == "train" or node_rank == 0 else 2
    for step in range(batches):
        loss = torch.tensor([float(rank + step)])
        dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    node, library, mode = sys.argv[1:4]
    if node == "all":
        mp.spawn(train, args=(0, library, mode), nprocs=NPROC_PER_NODE * NNODES, join=True)
    else:
        mp.spawn(train, args=(int(node) * NPROC_PER_NODE, library, mode), nprocs=NPROC_PER_NODE,
                 join=True)
