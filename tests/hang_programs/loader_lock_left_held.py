"""A DataLoader whose dataset guards a shared cache with a lock -- and one path forgets to
release it, so the next item in that worker waits on the lock for ever."""
import multiprocessing as mp

import torch
from torch.utils.data import DataLoader, Dataset


class Cached(Dataset):
    def __init__(self):
        self.lock = mp.Lock()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.lock.acquire()
        if i % 2 == 0:
            self.lock.release()
        return torch.full((4,), float(i))      # odd i: the lock stays held


if __name__ == "__main__":
    loader = DataLoader(Cached(), batch_size=4, num_workers=2)
    for batch in loader:
        print(batch.sum().item(), flush=True)
