"""A worker replaced by terminate(): "a new model version -- stop the old worker, start a new
one on the same queues".

The old worker, idle, waits in tasks.get(): it holds the queue's read lock while it waits for
data (only one reader at a time reads a Queue). terminate() kills it with the lock held, and
nobody ever releases it: the new worker can never get a task, though three wait in the queue.
(The multiprocessing docs warn of it under terminate().)
"""
import multiprocessing as mp


def worker(tasks, results, version):
    while True:
        n = tasks.get()
        if n is None:
            break
        results.put((version, n * n))


if __name__ == "__main__":
    tasks, results = mp.Queue(), mp.Queue()
    w = mp.Process(target=worker, args=(tasks, results, "v1"))
    w.start()
    for n in range(3):
        tasks.put(n)
    print([results.get() for _ in range(3)])

    w.terminate()                      # a new model version: replace the worker
    w.join()
    w = mp.Process(target=worker, args=(tasks, results, "v2"))
    w.start()
    for n in range(3):
        tasks.put(n)
    print([results.get() for _ in range(3)])
    tasks.put(None)
    w.join()
