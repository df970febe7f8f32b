"""DataLoader, as ``torch.utils.data``'s, for map-style datasets: N forked workers, batches in order.

    main process                                      worker i (forked, num_workers of them)
    index_queues[i].put((n, [indices of batch n]))  ─▶  worker_init_fn(i), then for each task:
       batch n goes to worker n % num_workers            data_queue.put((n, collate(items)))
    data_queue.get(): batches kept until their turn  ◀─
    an exception in a worker travels as its type and traceback, and is raised again in the main
      process: ValueError "Caught ValueError in DataLoader worker process 0. Original Traceback..."
    a worker gone, by a signal: RuntimeError "DataLoader worker (pid N) is killed by signal:
      Killed. ", then "DataLoader worker (pid(s) N) exited unexpectedly" raised from it

torch's words, as torch 2.13 says them (its SIGCHLD handler, then _try_get_data). Each worker
sees ``get_worker_info()`` (id, num_workers, seed, dataset) and is seeded as torch seeds it
(random and NumPy's global generator from base_seed + id). ``default_collate`` makes what
torch's makes: mpviz tensors of the samples' tensors, arrays and numbers, lists of their
strings, dicts and lists of those; a ``collate_fn`` of your own replaces it. Batches travel
pickled through a pipe: torch's go through shared memory (notebook 13, section 1). Adapted from
torch's ``utils/data/dataloader.py``, ``sampler.py``, ``_utils/worker.py`` and
``_utils/collate.py``. Which samples, in what order: ``sampler=`` (any iterable of indices, as a
DistributedSampler) or, with ``shuffle=True``, a new permutation each epoch (torch's
RandomSampler: a seed drawn from the process's generator -- mpviz.manual_seed repeats it --
then torch's randperm), else 0, 1, 2, ...; cut into batches of batch_size (torch's
BatchSampler). Left out: batch_sampler, generator, iterable datasets, pin_memory, timeout,
persistent_workers, prefetch_factor (2 batches per worker in flight, torch's default), a
non-fork start method.
"""
import multiprocessing
import queue
import random
import signal
import sys
import traceback
from typing import Any, NamedTuple

import numpy as np

from ... import random as _random
from ...functions import from_numpy, stack
from ...tensor import Tensor
from .distributed import randperm

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
    """A list of samples as one batch, as torch's: tensors (and NumPy arrays) stacked into one
    tensor along a new first dimension, numbers as a tensor (int64, float64), strings as their
    list, dicts by key, tuples and lists column by column (as a list)."""
    first = items[0]
    if isinstance(first, Tensor):
        return stack(items)
    if isinstance(first, (np.ndarray, np.generic)) and first.dtype.kind not in "OSU":
        return from_numpy(np.stack(items))
    if isinstance(first, (bool, int, float)):
        return from_numpy(np.array(items, dtype=float if isinstance(first, float) else None))
    if isinstance(first, (str, bytes)):
        return list(items)
    if isinstance(first, dict):
        return {key: default_collate([item[key] for item in items]) for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(item) != len(first) for item in items):
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(column)) for column in zip(*items)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts "
                    f"or lists; found {type(first)}")


class _Raised(NamedTuple):
    """An exception in a worker, as it travels to the main process (torch's ExceptionWrapper)."""
    kind: type
    text: str

    @classmethod
    def now(cls):
        """The exception being handled (a class defined in a function cannot be pickled)."""
        kind = sys.exc_info()[0]
        return cls(kind if kind.__qualname__.isidentifier() else RuntimeError,
                   traceback.format_exc())

    def reraise(self, worker_id):
        message = (f"Caught {self.kind.__name__} in DataLoader worker process {worker_id}.\n"
                   f"Original {self.text}")
        if self.kind is KeyError:                  # str(KeyError(m)) would quote m: torch's too
            message = _Unquoted(message)
        try:
            error = self.kind(message)
        except Exception:                          # a type that takes other arguments
            error = RuntimeError(message)
        raise error


class _Unquoted(str):
    def __repr__(self):
        return str(self)


def _worker_loop(worker_id, dataset, index_queue, data_queue, num_workers, seed, init_fn,
                 collate_fn):
    global _worker_info
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    _worker_info = WorkerInfo(worker_id, num_workers, seed, dataset)
    failed = None
    if init_fn is not None:
        try:
            init_fn(worker_id)
        except Exception:                          # torch: every batch of this worker raises it
            failed = _Raised.now()
    while True:
        task = index_queue.get()
        if task is None:                          # the main process is done with us
            return
        n, indices = task
        try:
            batch = failed or collate_fn([dataset[i] for i in indices])
        except Exception:                          # torch: sent as an ExceptionWrapper
            batch = _Raised.now()
        data_queue.put((n, batch))


class DataLoader:
    """``DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, *, num_workers=0,
    collate_fn=None, drop_last=False, worker_init_fn=None)``: iterate it for one epoch of
    batches, in order (new workers each epoch, as torch without persistent_workers). The
    samples: `sampler`'s indices, or a new random order each epoch with `shuffle`, else all in
    order; drop_last leaves out a last, smaller batch."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, *, num_workers=0,
                 collate_fn=None, drop_last=False, worker_init_fn=None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: a DataLoader needs a positive whole "
                             f"number of samples per batch. Fix: e.g. batch_size=4")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be non-negative; use num_workers=0 to "
                             f"disable multiprocessing (got {num_workers!r})")
        shuffle = bool(shuffle)                    # torch: any true value shuffles
        if sampler is not None and shuffle:        # torch's words, and its ValueError
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if sampler is not None and not hasattr(sampler, "__iter__"):
            raise TypeError(f"sampler={type(sampler).__name__}: a sampler is an iterable of "
                            f"indices into the dataset. Fix: e.g. sampler=DistributedSampler("
                            f"dataset), or sampler=[3, 1, 2]")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.sampler = shuffle, sampler
        self.num_workers, self.worker_init_fn = num_workers, worker_init_fn
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        self.drop_last = drop_last

    def _indices(self):
        """This epoch's indices, as torch's samplers give them: `sampler`'s, RandomSampler's (a
        seed drawn anew each epoch, then randperm), or SequentialSampler's."""
        if self.sampler is not None:
            return list(self.sampler)
        n = len(self.dataset)
        if self.shuffle:
            return randperm(n, int(_random.generator().integers(2 ** 32)))
        return list(range(n))

    def _batches(self, indices):
        """`indices` in batches of batch_size (torch's BatchSampler); drop_last: whole ones."""
        size = self.batch_size
        batches = [indices[i:i + size] for i in range(0, len(indices), size)]
        if self.drop_last and batches and len(batches[-1]) < size:
            batches.pop()
        return batches

    def __len__(self):
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        batches = self._batches(self._indices())
        if self.num_workers == 0:
            for indices in batches:
                yield self.collate_fn([self.dataset[i] for i in indices])
            return
        yield from _Workers(self, batches)


class _Workers:
    """One epoch with workers: start them, hand out batches round robin, take them back in
    order, and shut them down however the epoch ends."""

    def __init__(self, loader, batches):
        ctx = multiprocessing.get_context("fork")
        base_seed = random.getrandbits(63)         # torch: drawn anew for every epoch
        self.tasks = batches
        self.data_queue = ctx.Queue()
        self.index_queues, self.workers = [], []
        for i in range(loader.num_workers):
            index_queue = ctx.Queue()
            worker = ctx.Process(target=_worker_loop, daemon=True, args=(
                i, loader.dataset, index_queue, self.data_queue, loader.num_workers,
                base_seed + i, loader.worker_init_fn, loader.collate_fn))
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
                batch = ready.pop(n)
                if isinstance(batch, _Raised):
                    batch.reraise(n % len(self.workers))
                yield batch
        finally:
            self._shutdown()

    def _send(self, n):
        self.index_queues[n % len(self.workers)].put((n, self.tasks[n]))
        return n + 1

    def _get(self):
        """The next batch any worker put; raise torch's errors once a worker is gone -- after
        any error of the get, as torch's _try_get_data does: a batch whose worker was killed
        before it was received fails to arrive (file_descriptor: its fd cannot be fetched)."""
        while True:
            try:
                return self.data_queue.get(timeout=POLL_SECONDS)
            except Exception as error:
                gone = [w for w in self.workers if w.exitcode is not None]
                if not gone:
                    if isinstance(error, queue.Empty):
                        continue
                    raise
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
