"""DataLoader, as ``torch.utils.data``'s, for map-style datasets: N forked workers, batches in order.

    main process                                      worker i (forked, num_workers of them)
    index_queues[i].put((n, [indices of batch n]))  ─▶  worker_init_fn(i), then for each task:
       batch n goes to worker n % num_workers            data_queue.put((n, collate(items)))
    data_queue.get(): batches kept until their turn  ◀─
    a worker gone, by a signal: RuntimeError "DataLoader worker (pid N) is killed by signal:
      Killed. ", then "DataLoader worker (pid(s) N) exited unexpectedly" raised from it

torch's words, as torch 2.13 says them (its SIGCHLD handler, then _try_get_data). Each worker
sees ``get_worker_info()`` (id, num_workers, seed, dataset) and is seeded as torch seeds it
(random and NumPy's global generator from base_seed + id). Batches travel pickled through a
pipe: torch's go through shared memory (notebook 13, section 1). Adapted from torch's
``utils/data/dataloader.py`` and ``_utils/worker.py``; left out: samplers and shuffle,
iterable datasets, pin_memory, timeout, persistent_workers, prefetch_factor (2 batches per
worker in flight, torch's default), a non-fork start method.
"""
import multiprocessing
import queue
import random
import signal
from typing import Any, NamedTuple

import numpy as np

POLL_SECONDS = 0.5          # how often the main process checks its workers while it waits


class WorkerInfo(NamedTuple):
    """What ``get_worker_info()`` returns inside a worker (None in the main process)."""
    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info = None


def get_worker_info():
    return _worker_info


def default_collate(items):
    """A list of samples as one batch: NumPy arrays stacked, numbers as an array, dicts by key."""
    first = items[0]
    if isinstance(first, dict):
        return {key: default_collate([item[key] for item in items]) for key in first}
    if isinstance(first, (tuple, list)):
        return [default_collate(list(column)) for column in zip(*items)]
    if isinstance(first, np.ndarray):
        return np.stack(items)
    return np.array(items)


def _worker_loop(worker_id, dataset, index_queue, data_queue, num_workers, seed, init_fn):
    global _worker_info
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    if init_fn is not None:
        init_fn(worker_id)
    while True:
        task = index_queue.get()
        if task is None:                          # the main process is done with us
            return
        n, indices = task
        data_queue.put((n, default_collate([dataset[i] for i in indices])))


class DataLoader:
    """``DataLoader(dataset, batch_size=1, num_workers=0, worker_init_fn=None)``: iterate it for
    one epoch of batches, in order (new workers each epoch, as torch without
    persistent_workers)."""

    def __init__(self, dataset, batch_size=1, num_workers=0, worker_init_fn=None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: a DataLoader needs a positive whole "
                             f"number of samples per batch. Fix: e.g. batch_size=4")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be non-negative; use num_workers=0 to "
                             f"disable multiprocessing (got {num_workers!r})")
        self.dataset, self.batch_size = dataset, batch_size
        self.num_workers, self.worker_init_fn = num_workers, worker_init_fn

    def _batches(self):
        n = len(self.dataset)
        return [list(range(i, min(i + self.batch_size, n))) for i in range(0, n, self.batch_size)]

    def __len__(self):
        return len(self._batches())

    def __iter__(self):
        if self.num_workers == 0:
            for indices in self._batches():
                yield default_collate([self.dataset[i] for i in indices])
            return
        yield from _Workers(self)


class _Workers:
    """One epoch with workers: start them, hand out batches round robin, take them back in
    order, and shut them down however the epoch ends."""

    def __init__(self, loader):
        ctx = multiprocessing.get_context("fork")
        base_seed = random.getrandbits(63)         # torch: drawn anew for every epoch
        self.tasks = loader._batches()
        self.data_queue = ctx.Queue()
        self.index_queues, self.workers = [], []
        for i in range(loader.num_workers):
            index_queue = ctx.Queue()
            worker = ctx.Process(target=_worker_loop, daemon=True, args=(
                i, loader.dataset, index_queue, self.data_queue, loader.num_workers,
                base_seed + i, loader.worker_init_fn))
            worker.start()
            self.index_queues.append(index_queue)
            self.workers.append(worker)

    def __iter__(self):
        sent, ready = 0, {}
        try:
            while sent < min(len(self.tasks), 2 * len(self.workers)):    # prefetch_factor 2
                sent = self._send(sent)
            for n in range(len(self.tasks)):
                while n not in ready:
                    got, batch = self._get()
                    ready[got] = batch
                if sent < len(self.tasks):
                    sent = self._send(sent)
                yield ready.pop(n)
        finally:
            self._shutdown()

    def _send(self, n):
        self.index_queues[n % len(self.workers)].put((n, self.tasks[n]))
        return n + 1

    def _get(self):
        """The next batch any worker put; raise torch's errors once a worker is gone."""
        while True:
            try:
                return self.data_queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                gone = [w for w in self.workers if w.exitcode is not None]
                if not gone:
                    continue
                pids = ", ".join(str(w.pid) for w in gone)
                try:
                    killed = next((w for w in gone if w.exitcode < 0), None)
                    if killed is not None:
                        raise RuntimeError(
                            f"DataLoader worker (pid {killed.pid}) is killed by signal: "
                            f"{signal.strsignal(-killed.exitcode)}. ")
                    raise RuntimeError(
                        f"DataLoader worker (pid {gone[0].pid}) exited unexpectedly with exit "
                        f"code {gone[0].exitcode}. Details are lost due to multiprocessing. "
                        f"Rerunning with num_workers=0 may give better error trace.")
                except RuntimeError as exc:
                    raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited "
                                       f"unexpectedly") from exc

    def _shutdown(self):
        for index_queue, worker in zip(self.index_queues, self.workers):
            if worker.exitcode is None:
                index_queue.put(None)
        for worker in self.workers:
            worker.join(timeout=5)
            if worker.exitcode is None:
                worker.terminate()                 # torch too, after its join times out
                worker.join()
        for q in [self.data_queue, *self.index_queues]:
            q.cancel_join_thread()
            q.close()
