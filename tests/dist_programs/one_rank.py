"""One rank (world_size 1, a file:// rendezvous): collectives called by the names a program
imported before the recording hooked them, an async all_reduce waited for, a barrier."""
import sys

import torch
import torch.distributed as dist
from torch.distributed import all_reduce, barrier

if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    t = torch.ones(4)
    all_reduce(t)                                  # collective #1: 16 bytes
    work = dist.all_reduce(torch.ones(8), async_op=True)      # #2: 32 bytes, ends at wait()
    work.wait()
    barrier()                                      # #3
    dist.destroy_process_group()
    print(t.tolist())
