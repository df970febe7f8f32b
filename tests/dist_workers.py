"""Programs for tests/test_distributed.py: one body, run on torch.distributed and on mpviz.distributed.

``same_program(dist, make, rank, W)`` is written as a torch user would write it, with ``dist`` the
module and ``make(list)`` the float32 tensor constructor; it returns plain lists, compared by the
test. ``both(rank, W, ports, results)`` runs it on real torch (gloo) and on mpviz in the same rank
processes, one after the other.
"""
import datetime
import os

import numpy as np

TIMEOUT = datetime.timedelta(seconds=20)


def same_program(dist, make, rank, W):
    out = {}
    for name, op in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX),
                     ("min", dist.ReduceOp.MIN), ("product", dist.ReduceOp.PRODUCT)):
        t = make([rank + 1.0, -rank, 2.0, 0.5 * rank, 3.0])       # 5 elements: not divisible by W
        dist.all_reduce(t, op=op)
        out[name] = t.tolist()
    big = make(np.arange(100_003, dtype=np.float32) % 7 * (rank + 1))
    dist.all_reduce(big)
    out["big"] = [float(big.sum())] + big[:5].tolist() + big[-3:].tolist()
    b = make([float(rank)] * 4)
    dist.broadcast(b, src=W - 1)
    out["broadcast"] = b.tolist()
    gathered = [make([0.0, 0.0]) for _ in range(W)]
    dist.all_gather(gathered, make([rank, 10.0 * rank]))
    out["all_gather"] = [g.tolist() for g in gathered]
    scattered = make([0.0, 0.0, 0.0])
    dist.reduce_scatter(scattered, [make([j, rank, j * rank]) for j in range(W)])
    out["reduce_scatter"] = scattered.tolist()
    if rank == 0:
        dist.send(make([7.0, 8.0]), dst=1)
        r = make([0.0])
        dist.recv(r, src=1)
        out["recv"] = r.tolist()
    elif rank == 1:
        r = make([0.0, 0.0])
        dist.recv(r, src=0)
        dist.send(make([float(r.sum())]), dst=0)
        out["recv"] = r.tolist()
    evens = dist.new_group([r for r in range(W) if r % 2 == 0])
    if rank % 2 == 0:
        t = make([rank + 1.0])
        dist.all_reduce(t, group=evens)
        out["group"] = t.tolist()
    dist.barrier()
    return out


def sampler_indices(DistributedSampler, rank, W):
    """The indices DistributedSampler gives this rank, for a few data-set sizes and options."""
    out = []
    for n, shuffle, drop_last in ((10, True, False), (103, True, True), (7, False, False),
                                  (2, True, False)):
        s = DistributedSampler(range(n), num_replicas=W, rank=rank, shuffle=shuffle, seed=3,
                               drop_last=drop_last)
        for epoch in (0, 1):
            s.set_epoch(epoch)
            out.append([len(s), list(s)])
    return out


def both(rank, W, ports, results):
    import torch
    import torch.distributed as tdist
    from torch.utils.data import DistributedSampler as TorchSampler

    import mpviz
    import mpviz.distributed as mdist
    from mpviz.utils.data import DistributedSampler

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[0]}", rank=rank,
                             world_size=W, timeout=TIMEOUT)
    torch_out = same_program(tdist, lambda xs: torch.tensor(xs, dtype=torch.float32), rank, W)
    tdist.destroy_process_group()
    mdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank,
                             world_size=W, timeout=TIMEOUT)
    mpviz_out = same_program(mdist, lambda xs: mpviz.tensor(xs, dtype=mpviz.float32), rank, W)
    ddp = ddp_gradients(mdist, rank, W)
    mdist.destroy_process_group()
    results.put((rank, torch_out, mpviz_out, sampler_indices(TorchSampler, rank, W),
                 sampler_indices(DistributedSampler, rank, W), ddp))


def ddp_gradients(dist, rank, W):
    """DDP's gradients on this rank, and one process's gradients of the whole batch's mean loss."""
    import mpviz
    from mpviz import nn
    from mpviz.examples import MyModel, make_blobs
    from mpviz.nn.parallel import DistributedDataParallel as DDP

    mpviz.manual_seed(rank)                 # different weights per rank: DDP must broadcast rank 0's
    model = MyModel()
    ddp = DDP(model)
    data, labels = make_blobs(8 * W, seed=5)
    part = slice(rank * 8, (rank + 1) * 8)  # each rank: its 8 samples of the 8*W batch
    nn.functional.cross_entropy(ddp(data[part]), labels[part]).backward()
    reference = MyModel()
    reference.load_state_dict({k[len("module."):]: v for k, v in ddp.state_dict().items()})
    nn.functional.cross_entropy(reference(data), labels).backward()
    return [(p.grad.numpy().copy(), q.grad.numpy().copy())
            for p, q in zip(model.parameters(), reference.parameters())]


# -- programs that go wrong (mpviz only) ----------------------------------------------------------

def init(rank, W, port, seconds=20):
    import mpviz.distributed as dist
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("mpviz", rank=rank, world_size=W,
                            timeout=datetime.timedelta(seconds=seconds))
    return dist


def _report(results, rank, fn):
    try:
        fn()
        results.put((rank, None, None))
    except Exception as e:
        results.put((rank, type(e).__name__, str(e)))


def collective_only_on_rank_0(rank, W, port, results):
    """The classic: an all_reduce inside ``if rank == 0:``, then a barrier on every rank."""
    import mpviz
    dist = init(rank, W, port)

    def body():
        if rank == 0:
            dist.all_reduce(mpviz.ones(3))
        dist.barrier()
    _report(results, rank, body)
    dist.destroy_process_group()


def shapes_differ(rank, W, port, results):
    import mpviz
    dist = init(rank, W, port)
    _report(results, rank, lambda: dist.all_reduce(mpviz.ones(3 + (rank == W - 1))))
    dist.destroy_process_group()


def not_in_group(rank, W, port, results):
    """Rank 1 uses a group made of rank 0 only (torch warns and skips the call)."""
    import mpviz
    dist = init(rank, W, port)
    only_0 = dist.new_group([0])
    _report(results, rank, lambda: dist.all_reduce(mpviz.ones(3), group=only_0))
    dist.destroy_process_group()


def late_rank(rank, W, port, event, results):
    """Rank 1 is held back (until rank 0 gave up) while rank 0 waits in all_reduce #1 of a
    group whose timeout is 1 s (the rendezvous has its own 20 s: a loaded machine is slow)."""
    import mpviz
    dist = init(rank, W, port)
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=1))
    if rank == 1:
        event.wait(30)
        _report(results, rank, lambda: dist.all_reduce(mpviz.ones(3), group=group))
    else:
        _report(results, rank, lambda: dist.all_reduce(mpviz.ones(3), group=group))
        event.set()
    dist.destroy_process_group()


def rank_raises(rank, W, port, results):
    """Rank 1 raises (and exits) while rank 0 waits for it in all_reduce."""
    import mpviz
    dist = init(rank, W, port)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    _report(results, rank, lambda: dist.all_reduce(mpviz.ones(3)))
    dist.destroy_process_group()


def recv_from_a_rank_that_died(rank, W, port, results):
    """Rank 1 raises right after the rendezvous; rank 0 then receives from it (and, once that
    failed, sends to it), under a 20 s timeout."""
    import time

    import mpviz
    dist = init(rank, W, port)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    for op, call in (("recv", lambda: dist.recv(mpviz.zeros(3), src=1)),
                     ("send", lambda: dist.send(mpviz.ones(3), 1))):
        began = time.monotonic()
        try:
            call()
            results.put((op, None, None, time.monotonic() - began))
        except Exception as e:
            results.put((op, type(e).__name__, str(e), time.monotonic() - began))
    dist.destroy_process_group()


def rank_killed(rank, W, port, results):
    """Rank 1 is killed (SIGKILL) after the rendezvous; rank 0 waits for it in all_reduce."""
    import signal

    import mpviz
    dist = init(rank, W, port)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(mpviz.ones(3))
    except Exception as e:
        results.put((rank, type(e).__name__, str(e), port))
    dist.destroy_process_group()


def wrong_world_size(rank, W, port, started, results):
    """Two processes started, each told world_size=W+1 (both start init_process_group together:
    `started` is one semaphore per rank, a barrier of two that leaves no heap arena behind)."""
    started[rank].release()
    started[1 - rank].acquire()
    _report(results, rank, lambda: init(rank, W + 1, port, seconds=2))


def recorded(rank, W, port):
    import mpviz
    dist = init(rank, W, port)
    dist.all_reduce(mpviz.ones(10))
    dist.barrier()
    dist.destroy_process_group()


def mean_loss_on_rank_0_only(rank, W, port):
    """A loss logged by rank 0 alone: its second all_reduce inside ``if rank == 0:``; rank 1
    leaves (destroy_process_group) while rank 0 waits for it."""
    import mpviz
    dist = init(rank, W, port)
    loss = mpviz.ones(1) * (rank + 1)
    dist.all_reduce(loss)
    if rank == 0:
        dist.all_reduce(mpviz.ones(1))
    dist.destroy_process_group()
