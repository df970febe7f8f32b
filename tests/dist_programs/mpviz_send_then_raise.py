"""mpviz.distributed (the same API): rank 0 sends rank 1 its tensor, rank 1 receives it; then
rank 1 meets a bad batch and raises before the all_reduce that rank 0 waits in."""
import datetime
import os

import mpviz
import mpviz.distributed as dist
import mpviz.multiprocessing as mp


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    t = mpviz.zeros(4)
    if rank == 0:
        t += 1
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    if rank == 1:
        raise RuntimeError("bad batch on rank 1")
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2)
