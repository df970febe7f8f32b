"""The program ``bench_dataloader_trace.py`` runs, untraced and under ``mpviz trace``: real torch,
a ``DataLoader`` with `workers` worker processes over a small in-memory Dataset, `batches`
batches of 4 rows each, summed in the main process. Written as its author would write it:
nothing in it knows about mpviz.

    python bench/dataloader_program.py [batches=10000] [workers=8]
"""
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    """`n` rows of 4 floats, and a label per row."""

    def __init__(self, n):
        self.data = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], i % 10


def main(batches, workers):
    start = time.perf_counter()
    loader = DataLoader(Rows(batches * 4), batch_size=4, num_workers=workers)
    total, seen = 0.0, 0
    for x, y in loader:
        total += float(x.sum())
        seen += 1
    print(f"{seen} batches in {time.perf_counter() - start:.3f} s, sum {total:.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 8)
