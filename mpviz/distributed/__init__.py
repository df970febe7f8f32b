"""mpviz.distributed: torch.distributed's collectives on one machine, written to be read.

    import mpviz.distributed as dist                 # where torch has: import torch.distributed as dist

    def run(rank, world_size):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "29500"
        dist.init_process_group("mpviz", rank=rank, world_size=world_size)
        t = mpviz.ones(4) * (rank + 1)
        dist.all_reduce(t)                            # every rank now holds 1 + 2 + ... + W
        dist.destroy_process_group()

    mpviz.multiprocessing.spawn(run, args=(2,), nprocs=2)

Where each part lives (read them in this order):

* :mod:`.store` -- the TCP key-value store rank 0 runs: how ranks find each other;
* :mod:`.links` -- Unix sockets between ranks, for "done" messages and memfds;
* :mod:`.ring` -- the ring all-reduce: reduce-scatter then all-gather, through shared memory;
* :mod:`.group` -- a ProcessGroup: each collective numbered, checked, recorded, its failures
  turned into messages that name ranks;
* :mod:`.distributed_c10d` -- torch's function names (init_process_group, all_reduce ...).

The page for students: docs/DISTRIBUTED.md. When mpviz's recorder is on, the rendezvous, each
collective (begin/end per rank) and each ring step are events (``dist.*`` in trace/events.py).
"""
from .distributed_c10d import (GroupMember, Work, all_gather, all_reduce, barrier, broadcast,
                               destroy_process_group, get_backend, get_rank, get_world_size,
                               init_process_group, is_available, is_initialized, new_group, recv,
                               reduce_scatter, send)
from .errors import CollectiveError, DistError, DistNetworkError, DistStoreError
from .group import ProcessGroup, ReduceOp
from .store import TCPStore

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "is_available",
           "get_rank", "get_world_size", "get_backend", "new_group", "GroupMember",
           "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "send", "recv",
           "ReduceOp", "ProcessGroup", "Work", "TCPStore", "DistError", "DistNetworkError",
           "DistStoreError", "CollectiveError"]


# torch.distributed's functions that are not here, and what to use instead (a program ported by
# changing its import learns it at the name, not from a bare AttributeError)
_TORCH_ONLY = {
    "isend": "send() (it returns once the tensor is handed over, as isend's Work.wait() does)",
    "irecv": "recv() (blocking: call it where the program would call wait())",
    "batch_isend_irecv": "send() and recv() in an order both ranks follow",
    "reduce": "all_reduce() (every rank gets the result; use it on dst only)",
    "gather": "all_gather() (every rank gets the list; use it on dst only)",
    "scatter": "broadcast() of the whole list, each rank keeping its part",
    "all_to_all": "all_gather() and keep what is meant for this rank",
    "all_gather_into_tensor": "all_gather() into a list, then concatenate",
    "reduce_scatter_tensor": "reduce_scatter() with a list of the input's chunks",
    "all_gather_object": "all_gather() of tensors (objects are not sent here)",
    "broadcast_object_list": "broadcast() of tensors (objects are not sent here)",
    "monitored_barrier": "barrier() (its timeout error names the ranks that did not arrive)",
}


def __getattr__(name):
    if name in _TORCH_ONLY:
        raise AttributeError(
            f"mpviz.distributed has no {name}(): torch.distributed has it, mpviz.distributed keeps "
            f"all_reduce, broadcast, all_gather, reduce_scatter, barrier, send and recv. Fix: use "
            f"{_TORCH_ONLY[name]}, or run the program on torch.distributed.")
    raise AttributeError(f"module 'mpviz.distributed' has no attribute {name!r}")
