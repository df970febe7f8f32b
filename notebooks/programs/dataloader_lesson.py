"""Notebook 13's DataLoader programs: plain torch, nothing of mpviz (the notebook traces them).

Run one:  python dataloader_lesson.py workers N     12 images of 256 KiB, batch_size 4, N workers:
                                                    which worker made each batch
          python dataloader_lesson.py seeds         Augmented: two epochs, 2 workers, batch_size 2
          python dataloader_lesson.py seeds-fixed   the same with worker_init_fn=seed_worker
          python dataloader_lesson.py persistent    two epochs: the workers' pids, without and
                                                    with persistent_workers=True
          python dataloader_lesson.py pin           pin_memory=True: is the batch pinned?
          python dataloader_lesson.py persistent pin   several in one run
The datasets are in mpviz/examples/dataloader.py (importable: forked and spawned workers alike
find them there).
"""
import os
import sys
import warnings

from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from mpviz.examples.dataloader import Augmented, Images, seed_worker  # noqa: E402


def workers(n):
    loader = DataLoader(Images(), batch_size=4, num_workers=n)
    for step, batch in enumerate(loader):
        made_by = sorted(set(batch["worker"].tolist()))
        who = "the main process" if made_by == [-1] else f"worker {', '.join(map(str, made_by))}"
        print(f"batch {step}: images {batch['image'][:, 0].int().tolist()} made by {who} "
              f"(pid {batch['pid'][0].item()}); "
              f"in shared memory: {batch['image'].is_shared()}", flush=True)


def seeds(fixed):
    loader = DataLoader(Augmented(), batch_size=2, num_workers=2,
                        worker_init_fn=seed_worker if fixed else None)
    for epoch in range(2):
        for batch in loader:
            for index, worker, g, own in zip(*(batch[k].tolist() for k in
                                               ("index", "worker", "global_np", "own_rng"))):
                print(f"epoch {epoch} item {index} worker {worker}: np.random {g:3d}   "
                      f"self.rng {own:3d}", flush=True)


def persistent():
    for keep in (False, True):
        loader = DataLoader(Images(n=4, kib=1), batch_size=2, num_workers=2,
                            persistent_workers=keep)
        pids = [sorted({p for batch in loader for p in batch["pid"].tolist()}) for _ in range(2)]
        print(f"persistent_workers={keep}: worker pids, epoch 0 {pids[0]}, epoch 1 {pids[1]}",
              flush=True)


def pin():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        batch = next(iter(DataLoader(Images(n=4, kib=1), batch_size=2, num_workers=1,
                                     pin_memory=True)))
    for warning in said:
        print(f"warning: {warning.message}", flush=True)
    print(f"pinned: {batch['image'].is_pinned()}, in shared memory: "
          f"{batch['image'].is_shared()}", flush=True)


def main(args):
    """Run each program named in `args` in turn (one torch import for several)."""
    args = list(args) or ["workers"]
    while args:
        what = args.pop(0)
        if what == "workers":
            workers(int(args.pop(0)) if args and args[0].isdigit() else 2)
        elif what in ("seeds", "seeds-fixed"):
            seeds(what == "seeds-fixed")
        elif what == "persistent":
            persistent()
        elif what == "pin":
            pin()
        else:
            sys.exit(f"unknown program {what!r}: workers N, seeds, seeds-fixed, persistent or pin")


if __name__ == "__main__":
    main(sys.argv[1:])
