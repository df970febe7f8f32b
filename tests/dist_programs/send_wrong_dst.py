"""torch's "Writing Distributed Applications" point-to-point example, for 3 ranks -- but rank 0
sends only to rank 1, while every other rank receives from 0."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print('Rank ', rank, ' has data ', tensor[0])


def init_process(rank, size, fn, backend='gloo'):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ.setdefault('MASTER_PORT', '29500')
    dist.init_process_group(backend, rank=rank, world_size=size,
                            timeout=timedelta(seconds=int(os.environ.get("GLOO_TIMEOUT", 60))))
    fn(rank, size)


if __name__ == "__main__":
    size = 3
    mp.spawn(init_process, args=(size, run), nprocs=size, join=True)
