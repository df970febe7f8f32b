"""After training, rank 0 saves the model and logs it; the save holds the log's lock so that
the log and the file stay in step -- and log() takes the same lock again: a Lock is not
re-entrant. Every collective has completed; the group is still alive (gloo's threads poll
its sockets every 10 ms while rank 0 waits for ever)."""
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_log_lock = threading.Lock()


def log(msg):
    with _log_lock:
        print(msg, flush=True)


def save(model, path):
    with _log_lock:                      # keep the log and the file in step
        torch.save(model.state_dict(), path)
        log(f"saved {path}")


def run(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    model = torch.nn.Linear(4, 2)
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= world_size
    if rank == 0:
        save(model, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)
