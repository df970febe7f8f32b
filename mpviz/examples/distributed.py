"""Notebook 12's programs: the Hogwild model trained data-parallel, the ring, and five hangs.

Every rank runs the same function, ``fn(rank, world_size, ...)``, started by ``spawn`` (as
torch's DDP tutorial starts its ``demo_basic``); rank 0 holds the rendezvous on MASTER_PORT::

    run_ddp(2, epochs=3)           mpviz.distributed + DistributedDataParallel + DistributedSampler
    run_torch_ddp(2, epochs=3)     the same loop on torch.distributed (gloo, CPU), same weights
    trace_case("ring")             python -m mpviz trace -- python -m mpviz.examples.distributed ring

Run a case yourself: ``python -m mpviz.examples.distributed CASE [--fix]``, CASE one of
``ring [W [COUNT]]`` (W ranks all-reduce ring_input, or COUNT numbers), and the hangs of HANGS (each with its fix): ``disagree``, ``raises``, ``only-rank0``,
``world-size``, ``straggler``. Each hang is a program written as its author would; the notebook
runs it under ``mpviz trace --hang-after`` and reads the verdict.
"""
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np

import mpviz
import mpviz.distributed as dist
import mpviz.multiprocessing as mp
from mpviz import nn, optim
from mpviz.examples import data as blobs
from mpviz.examples.model import MyModel
from mpviz.examples.your_program import ROOT, TracedRun
from mpviz.nn.parallel import DistributedDataParallel as DDP
from mpviz.trace import load
from mpviz.utils.data import DistributedSampler

__all__ = ["run_ddp", "run_torch_ddp", "ring_input", "trace_case", "verdict", "epoch_orders",
           "HANGS", "free_port"]


def free_port():
    """A TCP port nobody listens on now (the kernel picks it): each run its own MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank, world_size, port=None, backend="mpviz", timeout=30):
    """What the DDP tutorial's ``setup`` does: the rendezvous address, then join the group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))


# -- the ring, with numbers you can follow: rank r holds (1, 2, 3 ...) * 10**r --------------------

def ring_input(rank, world_size):
    """Rank `rank`'s tensor for the ring: chunk c is (c + 1) * 10**rank, one element a chunk, so
    a sum's digits say which ranks it holds (rank 0: 1 2 3, rank 1: 10 20 30, 2: 100 200 300)."""
    return np.array([(c + 1) * 10.0 ** rank for c in range(world_size)], dtype=np.float32)


def ring(rank, world_size, count=None):
    """All-reduce ring_input (or, given `count`, `count` float32 numbers) once; print it."""
    setup(rank, world_size)
    mine = ring_input(rank, world_size) if count is None else \
        np.full(count, rank + 1.0, dtype=np.float32)
    t = mine.copy()
    dist.all_reduce(t)                       # SUM: every rank ends with 111 222 333 (3 ranks)
    if count is None:
        print(f"rank {rank}: {mine.tolist()} -> {t.tolist()}\n", end="", flush=True)  # one write
    dist.destroy_process_group()


# -- data-parallel training of the Hogwild model ------------------------------------------------

def _shard(sampler, epoch, set_epoch):
    if set_epoch:
        sampler.set_epoch(epoch)             # a new order each epoch, the same on every rank
    return list(sampler)


def ddp_train(rank, world_size, port, out, weights, epochs, set_epoch, n, batch_size, lr):
    """One rank: its part of each batch, DDP averages the gradients, every rank steps alike."""
    setup(rank, world_size, port)
    model = MyModel()
    for p, w in zip(model.parameters(), weights):
        p.data.numpy()[...] = w
    ddp = DDP(model)                         # broadcasts rank 0's weights: all start equal
    data, labels = blobs.make_blobs(n)
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=0)
    optimizer = optim.SGD(ddp.parameters(), lr=lr)
    train_epochs(ddp, data, labels, sampler, optimizer, nn.functional.cross_entropy,
                 epochs, set_epoch, batch_size, os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()


def train_epochs(ddp, data, labels, sampler, optimizer, loss_fn, epochs, set_epoch, batch_size,
                 path):
    """The loop every rank runs, mpviz's or torch's objects alike (they have the same methods);
    the mean loss of each epoch, the indices read and the final weights go to `path`."""
    losses, orders = [], []
    for epoch in range(epochs):
        order = _shard(sampler, epoch, set_epoch)
        orders.append(order)
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(ddp(data[idx]), labels[idx])
            loss.backward()                  # ... and DDP's all_reduce of the gradients
            optimizer.step()
            total += float(loss.item()) * len(idx)
        losses.append(total / len(order))
    final = [p.detach().numpy().tolist() for p in ddp.module.parameters()]
    with open(path, "w") as f:
        json.dump({"losses": losses, "orders": orders, "weights": final}, f)


def torch_ddp_train(rank, world_size, port, out, weights, epochs, set_epoch, n, batch_size, lr):
    """The same rank on real torch.distributed (gloo): torch's DDP, sampler, SGD, loss."""
    faulthandler.dump_traceback_later(TORCH_LIMIT - 20, exit=True)   # a hang: stacks, exit
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP
    from torch.utils.data import DistributedSampler as TorchSampler
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=world_size,
                             timeout=timedelta(seconds=30))
    model = torch.nn.Sequential(torch.nn.Linear(blobs.N_FEATURES, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, blobs.N_CLASSES))
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.tensor(w))
    ddp = TorchDDP(model)
    data, labels = (torch.from_numpy(t.numpy()) for t in blobs.make_blobs(n))
    sampler = TorchSampler(range(n), num_replicas=world_size, rank=rank, seed=0)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    train_epochs(ddp, data, labels, sampler, optimizer, torch.nn.functional.cross_entropy,
                 epochs, set_epoch, batch_size, os.path.join(out, f"rank{rank}.json"))
    tdist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    # Kept until the rank's process ends (fork's children end by os._exit: no destructor
    # runs). Freed as this function returns, the DDP's Reducer took the last reference to
    # torch 2.13's ProcessGroupGloo, whose destructor then waited on a mutex for ever: 1 run
    # of 4 at load 6 (its main thread in ~ProcessGroupGloo, by gdb; gloo's own threads still
    # polling every 10 ms). torch's bug, not the lesson's.
    _KEPT.append(ddp)


_KEPT = []


def _settings(world_size, epochs, set_epoch, n, batch_size, lr, seed):
    model = MyModel()
    rng = np.random.default_rng(seed)        # the same first weights for mpviz and torch
    weights = [rng.uniform(-0.5, 0.5, p.shape).astype(np.float32) for p in model.parameters()]
    return dict(weights=weights, epochs=epochs, set_epoch=set_epoch, n=n,
                batch_size=batch_size, lr=lr)


def _results(out, world_size):
    ranks = []
    for rank in range(world_size):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    losses = np.mean([r["losses"] for r in ranks], axis=0).tolist()   # the whole data's mean
    return {"losses": losses, "orders": [r["orders"] for r in ranks],
            "weights": [r["weights"] for r in ranks]}


def run_ddp(world_size=2, epochs=3, set_epoch=True, n=512, batch_size=32, lr=0.1, seed=0):
    """Train with mpviz.distributed on `world_size` spawned ranks. Returns {"losses": the mean
    loss of each epoch, "orders": [rank][epoch] the sample indices read, "weights": [rank] the
    final parameters (as lists)}."""
    s = _settings(world_size, epochs, set_epoch, n, batch_size, lr, seed)
    with tempfile.TemporaryDirectory(prefix="mpviz-ddp-") as out:
        mp.spawn(ddp_train, args=(world_size, free_port(), out, s["weights"], epochs, set_epoch,
                                  n, batch_size, lr), nprocs=world_size)
        return _results(out, world_size)


TORCH_LIMIT = 90      # s, for torch's import and a few epochs of 2-4 ranks (~10 s here;
                      # 2.4 s at rest): below the tests' 120 s, so that a hang's stacks show


def run_torch_ddp(world_size=2, epochs=3, set_epoch=True, n=512, batch_size=32, lr=0.1, seed=0):
    """``run_ddp`` on real torch.distributed (gloo), in a new Python that imports torch once and
    forks its ranks (torch's import is the slow part). Same weights, data and order.

    Should it hang, each rank prints its stacks at TORCH_LIMIT - 20 s and exits (faulthandler,
    in torch_ddp_train), so the error says where; the run is its own session, so that nothing it
    started outlives it."""
    with tempfile.TemporaryDirectory(prefix="mpviz-torch-ddp-") as out:
        args = json.dumps([world_size, epochs, set_epoch, n, batch_size, lr, seed, out])
        run = subprocess.Popen([sys.executable, "-m", __name__, "torch-ddp", args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_env(), cwd=ROOT, start_new_session=True)
        try:
            _, stderr = run.communicate(timeout=TORCH_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)          # its ranks too
            _, stderr = run.communicate()
            raise RuntimeError(f"the torch run did not end in {TORCH_LIMIT} s:\n"
                               f"{stderr[-4000:]}") from None
        if run.returncode != 0:
            raise RuntimeError(f"the torch run failed (exit {run.returncode}):\n{stderr[-4000:]}")
        return _results(out, world_size)


def _torch_main(world_size, epochs, set_epoch, n, batch_size, lr, seed, out):
    import torch._dynamo                 # noqa: F401 (DDP and SGD import it on first use: once
    import torch.multiprocessing as tmp  # here, not in each forked rank at once)
    s = _settings(world_size, epochs, set_epoch, n, batch_size, lr, seed)
    ranks = tmp.start_processes(torch_ddp_train, args=(world_size, free_port(), out,
                                                       s["weights"], epochs, set_epoch, n,
                                                       batch_size, lr),
                                nprocs=world_size, start_method="fork", join=False)
    # A rank that hangs before its own dump_traceback_later: this process's stacks, then exit
    # (run_torch_ddp shows them). Only now, after the forks: the timer is a thread, and a
    # child forked while it waits inherits its lock held -- its own dump_traceback_later then
    # waits for ever (mpviz trace showed it: "forked after native threads").
    faulthandler.dump_traceback_later(TORCH_LIMIT - 10, exit=True)
    while not ranks.join():
        pass
    faulthandler.cancel_dump_traceback_later()


def epoch_orders(n=8, world_size=2, epochs=3, set_epoch=True, shuffle=True, seed=0):
    """[epoch][rank] the indices DistributedSampler gives, with or without set_epoch."""
    samplers = [DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=shuffle,
                                   seed=seed) for r in range(world_size)]
    return [[_shard(s, epoch, set_epoch) for s in samplers] for epoch in range(epochs)]


# -- five hangs, each written as its author would, and its fix ----------------------------------

def disagree(rank, world_size, fixed=False):
    """5 batches dealt by hand: rank 0 gets 3, rank 1 gets 2. Rank 0's all_reduce #3 meets
    rank 1's barrier #3. Fix: DistributedSampler pads every rank to the same number."""
    setup(rank, world_size)
    batches = list(range(5))
    mine = ([batches[i] for i in DistributedSampler(batches, world_size, rank, shuffle=False)]
            if fixed else batches[rank::world_size])
    for b in mine:
        dist.all_reduce(mpviz.ones(4) * b)           # the gradients of batch b
    dist.barrier()                                   # "everyone done with the epoch"
    dist.destroy_process_group()


def raises(rank, world_size, fixed=False):
    """Rank 1's second batch is corrupt and it raises; rank 0 goes on to all_reduce #2. Fix:
    every rank says whether its batch is good, and all skip a batch that is bad anywhere."""
    setup(rank, world_size)
    for step in range(3):
        corrupt = rank == 1 and step == 1
        if fixed:
            good = mpviz.tensor([0.0 if corrupt else 1.0])
            dist.all_reduce(good, op=dist.ReduceOp.MIN)      # 0 if any rank's batch is bad
            if good.item() == 0:
                continue                                      # every rank skips it together
        elif corrupt:
            raise ValueError(f"sample {step} of rank {rank} is corrupt")
        dist.all_reduce(mpviz.ones(4) * step)
    dist.destroy_process_group()


def only_rank0(rank, world_size, fixed=False):
    """Rank 0 logs the mean loss: its all_reduce sits inside ``if rank == 0:``, so rank 1 never
    calls it and leaves. Fix: every rank all-reduces; only rank 0 prints."""
    setup(rank, world_size)
    loss = mpviz.tensor([1.0 + rank])
    dist.all_reduce(loss)                            # collective #1: everyone
    if fixed:
        total = mpviz.tensor([loss.item()])
        dist.all_reduce(total)                       # collective #2: everyone
    if rank == 0:
        if not fixed:
            total = mpviz.tensor([loss.item()])
            dist.all_reduce(total)                   # collective #2: rank 0 only
        print("mean loss", total.item() / world_size, flush=True)
    dist.destroy_process_group()


def straggler(rank, world_size, fixed=False):
    """Rank 1 reads its second batch from a slow disk (2 s): the others wait in all_reduce #2.
    Slow, not stuck. (The "fix" here is patience: a --hang-after longer than the slow read.)"""
    setup(rank, world_size)
    for step in range(3):
        if rank == 1 and step == 1:
            time.sleep(2.0)                          # the slow disk
        dist.all_reduce(mpviz.ones(4) * step)
    dist.destroy_process_group()


def world_size_case(nprocs, fixed=False):
    """world_size=3 in init_process_group, but 2 processes started: rank 0 and 1 wait at the
    rendezvous for a rank 2 that never comes. Fix: world_size = the number started."""
    world_size = nprocs if fixed else nprocs + 1
    mp.spawn(_join, args=(world_size,), nprocs=nprocs)


def _join(rank, world_size):
    setup(rank, world_size)
    dist.all_reduce(mpviz.ones(4))
    dist.destroy_process_group()


HANGS = {"disagree": disagree, "raises": raises, "only-rank0": only_rank0,
         "world-size": None, "straggler": straggler}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def trace_case(case, *args, hang_after=1.0, timeout=90):
    """``python -m mpviz trace --hang-after H -- python -m mpviz.examples.distributed CASE``,
    run from the notebook (a new Python: the kernel forks nothing). Returns a TracedRun."""
    if case != "ring" and case not in HANGS:
        raise ValueError(f"no case {case!r}. Fix: 'ring' or one of {', '.join(HANGS)}")
    directory = tempfile.mkdtemp(prefix=f"mpviz-{case}-")
    command = [sys.executable, "-m", "mpviz", "trace", "--hang-after", str(hang_after),
               "--no-plot", "-o", directory, "--", sys.executable, "-m", __name__, case,
               *map(str, args)]
    env = _env()
    env["MASTER_PORT"] = str(free_port())
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)
    return TracedRun(command, done.returncode, done.stdout, done.stderr, directory,
                     load(directory))


def verdict(run):
    """What ``mpviz trace`` said of `run`: its verdict and the lines under it, or that it had
    nothing to say; then the exit status."""
    lines, keep = [], False
    for line in run.messages.splitlines():
        if line.startswith(("mpviz trace: ", "Where each", "Who waits")):   # (the stacks: not)
            keep = line.startswith(("mpviz trace: HANG", "mpviz trace: FAILED"))
        if keep:
            lines.append(line.replace("mpviz trace: ", "", 1))
    return "\n".join(lines or ["no verdict: the program ended by itself"]) + \
        f"\nexit status {run.status}"


def main(argv):
    case, rest = argv[0], argv[1:]
    if case == "torch-ddp":
        return _torch_main(*json.loads(rest[0]))
    fixed = "--fix" in rest
    numbers = [int(a) for a in rest if a.isdigit()]
    world_size = numbers[0] if numbers else (3 if case == "ring" else 2)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if case == "ring":                       # ring [W [COUNT]]
        count = numbers[1] if len(numbers) > 1 else None
        mp.spawn(ring, args=(world_size, count), nprocs=world_size)
    elif case == "world-size":
        world_size_case(world_size, fixed)
    else:
        mp.spawn(HANGS[case], args=(world_size, fixed), nprocs=world_size)


if __name__ == "__main__":
    main(sys.argv[1:])
