"""Hogwild's worker, its score, and a helper that runs N workers on one shared model.

``train`` is the worker of torch's Hogwild example, in the example's shape::

    for data, labels in data_loader:
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()        # in place: with a shared model, every process sees it

Each worker builds its own data set (the same points, from the same seed), its own loader (its
own shuffle order) and its own optimizer; only the model's parameters are shared. Workers don't
lock: their updates interleave, which SGD tolerates (Niu et al., "Hogwild!", 2011).

``run_hogwild`` is the example's ``__main__`` block as a function (start N processes, join them),
plus a check that every worker exited cleanly, so tests and notebooks can call it with a context.
"""
import os

from .. import no_grad, nn, optim
from . import data as blobs


def train(model, rank=None, epochs=1, lr=0.1, batch_size=32, n=2000, seed=0):
    """Train `model` (a ``MyModel()``) in place on ``make_blobs(n, seed=seed)``, one pass per epoch.

    `rank` seeds this worker's shuffle order (None: a fresh order from the process id).
    """
    # Construct data_loader, optimizer, etc.
    data, labels = blobs.make_blobs(n, seed=seed)
    shuffle_seed = os.getpid() if rank is None else 1000 + rank
    data_loader = blobs.data_loader(data, labels, batch_size, seed=shuffle_seed, epochs=epochs)
    optimizer = optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.functional.cross_entropy
    for data, labels in data_loader:
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()  # This will update the shared parameters


def accuracy(model, data, labels):
    """The fraction of rows of `data` whose highest score is at their label (a float in [0, 1])."""
    with no_grad():
        predicted = model(data).argmax(1)
    return float((predicted == labels).__array__().mean())


def run_hogwild(model, num_processes=4, ctx=None, **train_kwargs):
    """Train `model` with `num_processes` workers (``ctx``: a multiprocessing context) and wait.

    Raises RuntimeError naming the worker if one fails. Does *not* call ``model.share_memory()``:
    that is the caller's choice, and the lesson (under fork, without it, the parent learns nothing).
    """
    if ctx is None:
        from .. import multiprocessing as ctx
    processes = []
    for rank in range(num_processes):
        p = ctx.Process(target=train, args=(model,), kwargs=dict(train_kwargs, rank=rank))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    failed = [p for p in processes if p.exitcode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} Hogwild worker(s) failed: " + ", ".join(
            f"{p.name} exit code {p.exitcode}" for p in failed) + " (their tracebacks are on stderr)")
    return model
