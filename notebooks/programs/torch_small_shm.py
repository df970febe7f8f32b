"""Notebook 11's program in real torch: a DataLoader whose batches fill a container's 64 MiB
/dev/shm. A plain torch script; it knows nothing of mpviz.

    python torch_small_shm.py          (in a container: docker run's default --shm-size=64m)

Four workers, prefetch_factor=2: the DataLoader keeps 4 x 2 = 8 batches of 8 MiB in flight, and
each one lives in /dev/shm until the training loop lets go of it. This loop keeps every batch it
gets (a slow first step, a list of batches for later: the same for /dev/shm).
"""
import torch
from torch.utils.data import DataLoader, Dataset

BATCH_MB = 8


class Big(Dataset):
    """8 samples of 8 MiB each (2 Mi float32)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((BATCH_MB << 18,), float(i))


def main():
    loader = DataLoader(Big(), batch_size=1, num_workers=4, prefetch_factor=2)
    kept = []
    try:
        for batch in loader:
            kept.append(batch)
    except RuntimeError as exc:
        print(f"after {len(kept)} batches: {type(exc).__name__}: {exc}".rstrip())
    else:
        print(f"all {len(kept)} batches of {BATCH_MB} MiB arrived")


if __name__ == "__main__":
    main()
