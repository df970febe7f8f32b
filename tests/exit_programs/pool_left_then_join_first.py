"""A Pool block left while a task still runs (its exit terminates the Pool: the busy worker is
killed), then a worker's result forgotten, and the worker joined -- the hang is the join.
"""
from multiprocessing import Pool, Process, Queue
import time


def slow(x):
    time.sleep(5)
    return x


def big(q):
    q.put(bytes(1 << 20))


if __name__ == "__main__":
    with Pool(2) as pool:                 # leaving the block terminates the Pool
        pool.apply_async(slow, (1,))
        time.sleep(0.5)                   # (the task has started)
    q = Queue()
    p = Process(target=big, args=(q,))
    p.start()
    p.join()                              # (its result is never read)
