"""optimizer-state: Hogwild shares the parameters, but each worker's optimizer state is its own.

What happens: ``model.share_memory()`` puts the *parameters* in shared memory, and every worker
writes its steps into them. But the example gives each worker its own optimizer, and an
optimizer with state -- SGD's momentum buffers, Adam's running averages -- creates that state in
the worker's process, after it started: private to that worker. With N workers there are N
momentum buffers per parameter, each fed with one worker's gradients only, none in the parent::

    parent      model (shared) ─────────────────────────────┐
    worker 0    SGD(momentum=0.9) → buf₀ (private)  steps ─┤ into the same shared weights
    worker 1    SGD(momentum=0.9) → buf₁ (private)  steps ─┘
                buf₀ ≠ buf₁; the parent has no momentum at all

That is not always wrong, but it is not one optimizer run by N workers, which is what people
expect. The fix, where one state is wanted (torch users' "shared optimizer", e.g. SharedAdam in
the A3C examples): create the optimizer once, in the parent, make its state shared
(``optimizer.share_memory()`` here), and give it to the workers with the model
(``shared_state=True``): one buffer per parameter, updated by all, visible in the parent.
"""
from .. import manual_seed, nn, optim
from ..examples import MyModel
from ..examples.data import data_loader, make_blobs
from ._common import check_between, context, get, start_method_param, step
from .base import Param

SUMMARY = "each Hogwild worker's optimizer keeps its own momentum; a shared optimizer keeps one"
PARAMS = {
    "shared_state": Param(False, [False, True],
                          "one SGD made in the parent, its momentum shared, given to the workers"),
    "nprocs": Param(2, None, "Hogwild workers"),
    "start_method": start_method_param("spawn"),
}
MOMENTUM = 0.9


def check_params(p):
    check_between(p, "nprocs", 1, 4)


def _buffer(optimizer, p):
    """The momentum buffer of parameter `p`: [where it lives, its shared segment or None, its
    first values]."""
    buf = optimizer.state.get(id(p))
    if buf is None:
        return None
    if hasattr(buf, "is_shared") and buf.is_shared():
        return ["shared", buf.untyped_storage().segment_name, buf.numpy().ravel()[:2].tolist()]
    values = buf.numpy() if hasattr(buf, "numpy") else buf
    return ["private", None, values.ravel()[:2].tolist()]


def worker(model, rank, out, optimizer=None):
    """Train one pass with momentum SGD: the given (shared) optimizer, or one of our own."""
    if optimizer is None:
        optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=MOMENTUM)
    data, labels = make_blobs(600, seed=0)
    loss_fn = nn.functional.cross_entropy
    for x, y in data_loader(data, labels, 32, seed=1000 + rank, epochs=1):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    first = next(iter(model.parameters()))
    step("worker trained", rank=rank)
    out.put((rank, _buffer(optimizer, first)))


def drive(p, details):
    ctx = context(p)
    manual_seed(0)
    model = MyModel()
    model.share_memory()                           # the parameters are shared either way
    shared = None
    if p["shared_state"]:
        shared = optim.SGD(model.parameters(), lr=0.05, momentum=MOMENTUM).share_memory()
        step("optimizer.share_memory(): one momentum buffer per parameter, shared")
    out = ctx.Queue()
    workers = [ctx.Process(target=worker, args=(model, rank, out, shared), name=f"worker-{rank}")
               for rank in range(p["nprocs"])]
    for w in workers:
        w.start()
    reports = dict(get(out, timeout=25, what="a worker's report") for _ in workers)
    for w in workers:
        w.join()
    details["workers"] = {str(rank): reports[rank] for rank in sorted(reports)}
    details["exitcodes"] = [w.exitcode for w in workers]
    first = next(iter(model.parameters()))
    details["parent"] = _buffer(shared, first) if shared is not None else None


def verdict(t, details):
    prm = details["params"]
    if any(details["exitcodes"]):
        return "error", f"A worker failed: exit codes {details['exitcodes']} (see the output)."
    buffers = list(details["workers"].values())
    n = len(buffers)
    if not prm["shared_state"]:
        distinct = len({tuple(values) for _, _, values in buffers})
        return "warning", (
            f"{n} workers trained the shared model with momentum SGD, each with its own "
            f"optimizer: each made its own momentum buffer, in its own process "
            f"({', '.join(where for where, _, _ in buffers)}), fed with its own gradients only "
            f"(the first parameter's buffers start {'; '.join(str(v) for _, _, v in buffers)}: "
            f"{distinct} different buffer(s) for {n} workers). The parent has no optimizer "
            f"state at all. The weights are shared; the "
            f"optimizer state is per process. Fix, where one state is wanted: make the "
            f"optimizer in the parent, share its state (optimizer.share_memory()) and give it "
            f"to the workers with the model (shared_state=True).")
    parent = details["parent"]
    segments = {segment for _, segment, _ in buffers}
    if parent and parent[0] == "shared" and segments == {parent[1]} and any(parent[2]):
        return "ok", (
            f"One optimizer, made in the parent with its momentum buffers in shared memory, was "
            f"given to the {n} workers: every worker stepped the same buffer (one segment, "
            f"{parent[1]}), and the parent sees what they made of it (it starts {parent[2]}, "
            f"no longer zeros): one optimizer state for all.")
    return "warning", (f"The workers' buffers {buffers} are not the parent's {parent}: the "
                       f"optimizer state did not travel as shared memory.")
