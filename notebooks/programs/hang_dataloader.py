"""A program that hangs: a DataLoader whose dataset never returns one item.

Each DataLoader worker (a process, forked) calls the dataset's ``__getitem__`` for the items of
a batch, collates them and puts the batch on a queue; the main process takes batches in order.
Here item 5 is "still downloading": ``__getitem__`` waits for a file that never comes, in
``time.sleep`` steps of an hour. The main process waits for the batch that holds item 5, and
a DataLoader made without ``timeout`` waits for it for ever (it checks every 5 s that the
worker is still alive -- it is: asleep).

Run it:   python hang_dataloader.py          (hangs at the second batch; Ctrl-C to stop)
          python hang_dataloader.py --fix    (DataLoader(timeout=2): a clear error, exit 1)
"""
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    """Ten "images"; item 5 waits for a file that is never written."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        if index == 5:
            while not os.path.exists("/nonexistent/image-5.png"):
                time.sleep(3600)                 # "retry in an hour"
        return torch.full((3, 8, 8), float(index))


def main():
    fix = "--fix" in sys.argv[1:]
    loader = DataLoader(Images(), batch_size=4, num_workers=1, **({"timeout": 2} if fix else {}))
    for step, batch in enumerate(loader):
        print(f"batch {step}: {tuple(batch.shape)}, mean {batch.mean().item():.1f}", flush=True)
    print("epoch done", flush=True)


if __name__ == "__main__":
    main()
