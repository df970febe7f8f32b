"""torch's mp.spawn: rank 0 sends rank 1 its data -- unless it has nothing to send."""
import torch
import torch.multiprocessing as mp


def run(rank, q, n):
    if rank == 0:
        data = torch.arange(n)
        if len(data) > 0:
            q.put(data)
    else:
        data = q.get()              # waits for rank 0
        print(rank, data.sum().item(), flush=True)


if __name__ == "__main__":
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(q, 0), nprocs=2)
