"""hogwild: N workers train one shared model; under fork without ``share_memory()`` the parent learns nothing.

What happens: Hogwild (torch's multiprocessing notes) trains one model from several processes
at once, each with its own data order and optimizer, all writing into the *same* parameters in
shared memory, without locks. ``model.share_memory()`` is what puts the parameters there.
Under ``fork`` a child starts as a copy of the parent: without ``share_memory()`` each worker
trains its own copy-on-write copy of the parameters, the copies die with the workers, and the
parent's model is exactly as untrained as before -- no error, and its accuracy stays at an
untrained model's (pitfall #10)::

    share=True    parent params ══ shared segment ══ worker 0 / worker 1 update them in place
                  → the parent's accuracy rises
    share=False   parent params    worker 0: private copy (trained, then gone)
    (fork)                         worker 1: private copy (trained, then gone)
                  → the parent's accuracy stays where it was before training

Under ``spawn``/``forkserver`` the model is pickled to each child, and pickling a tensor shares
it (like torch), so it learns either way -- the trap is specific to fork, which was Linux's
default before Python 3.14. The fix: call ``model.share_memory()`` before starting workers.
"""
from .. import manual_seed
from ..examples import MyModel, accuracy, make_blobs, train
from ._common import check_between, context, start_method_param, step
from .base import Param

SUMMARY = "shared model, N workers; under fork without share_memory() the parent learns nothing"
PARAMS = {
    "share": Param(True, [True, False], "call model.share_memory() before starting the workers"),
    "nprocs": Param(2, None, "Hogwild workers"),
    "epochs": Param(2, None, "passes over the data per worker"),
    "start_method": start_method_param("fork", "the trap needs fork; spawn shares by pickling"),
}


def check_params(p):
    check_between(p, "nprocs", 1, 4)
    check_between(p, "epochs", 1, 10)


def hogwild_worker(model, rank, epochs):
    for epoch in range(epochs):
        train(model, rank=rank * 100 + epoch, epochs=1)
        step("epoch done", rank=rank, epoch=epoch)


def _checksum(model):
    return float(sum(float(abs(p.detach().numpy()).sum()) for p in model.parameters()))


def drive(p, details):
    ctx = context(p)
    manual_seed(0)
    model = MyModel()
    data, labels = make_blobs(1000, seed=1)
    details["accuracy_before"] = accuracy(model, data, labels)
    before = _checksum(model)
    if p["share"]:
        model.share_memory()
        step("model.share_memory()")
    workers = [ctx.Process(target=hogwild_worker, args=(model, rank, p["epochs"]),
                           name=f"hogwild-{rank}") for rank in range(p["nprocs"])]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    details["exitcodes"] = [w.exitcode for w in workers]
    details["accuracy_after"] = accuracy(model, data, labels)
    details["parent_params_changed"] = _checksum(model) != before
    step("parent measured accuracy", accuracy=details["accuracy_after"])


def verdict(t, details):
    prm = details["params"]
    a0, a1 = details["accuracy_before"], details["accuracy_after"]
    if any(details.get("exitcodes", [])):
        return "error", f"A worker failed: exit codes {details['exitcodes']} (see the output)."
    text = (f"{prm['nprocs']} workers trained {prm['epochs']} epoch(s) each under "
            f"'{prm['start_method']}'; the parent's accuracy went from {a0:.1%} to {a1:.1%}. ")
    if details.get("parent_params_changed") and a1 > max(a0 + 0.2, 0.6):
        return "ok", text + (
            "The workers updated the parent's parameters in place"
            + (": model.share_memory() put them in shared memory before the fork."
               if prm["share"] else ": spawn pickled the model, and pickling a tensor shares it."))
    return "warning", text + (
        "The parent's parameters never changed: each forked worker trained its own "
        "copy-on-write copy, which died with it. Nothing raised an error. Fix: call "
        "model.share_memory() before starting the workers (share=True).")
