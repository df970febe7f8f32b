"""Workers wait for a start signal before they work; the parent starts them and joins them, but
the line that sets the signal was lost in an edit."""
import multiprocessing as mp


def worker(start, n):
    start.wait()                       # wait until every worker is ready
    print(n * n)


if __name__ == "__main__":
    start = mp.Event()
    workers = [mp.Process(target=worker, args=(start, n)) for n in range(2)]
    for w in workers:
        w.start()
    # start.set()
    for w in workers:
        w.join()
