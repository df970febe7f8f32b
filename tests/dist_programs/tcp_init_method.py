"""The rendezvous by init_method="tcp://127.0.0.1:PORT", as torch's docs show it (no MASTER_PORT):
the port is the first argument."""
import sys
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=60))
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2, int(sys.argv[1])), nprocs=2, join=True)
