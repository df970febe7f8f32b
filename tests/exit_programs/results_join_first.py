"""Collect many small results from a worker through a queue -- joining the worker first.

CPython issue 91594's shape: the worker's puts return at once, its feeder thread writes them
into the queue's pipe, and the pipe fills; the worker, exiting, waits for its feeder thread;
the main program waits for the worker before it reads a single result.
"""
import multiprocessing as mp


def worker(q):
    for i in range(5000):
        q.put(i)          # many small results


if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=worker, args=(q,))
    p.start()
    p.join()              # wait for the worker to finish ...
    results = [q.get() for _ in range(5000)]   # ... then collect
    print(len(results))
