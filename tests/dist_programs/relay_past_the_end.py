"""A relay: each rank adds 1 to the tensor it got from the rank before and passes it on; then all
ranks all_reduce it. The bug: the last rank passes it to rank world_size, which does not exist
(the `% world_size` was forgotten), so it raises there and never joins the all_reduce."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.zeros(4)
    if rank > 0:
        dist.recv(t, src=rank - 1)
    t += 1
    dist.send(t, dst=rank + 1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
