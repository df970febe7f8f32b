"""Workers wait for a start signal, a Manager's Event, before they work; the parent starts
them, and was meant to call ``start.set()`` once it had loaded the data -- that line is
missing, so each worker's ``start.wait()`` waits for ever, and the parent's join with them."""
from multiprocessing import Manager, Process


def worker(start, results, n):
    start.wait()                 # the go signal
    results.append(n * n)


if __name__ == "__main__":
    with Manager() as manager:
        start = manager.Event()
        results = manager.list()
        workers = [Process(target=worker, args=(start, results, n)) for n in range(2)]
        for w in workers:
            w.start()
        data = list(range(1000))     # "load the data"; start.set() was meant to follow
        for w in workers:
            w.join()
        print(sorted(results))
