"""A ProcessPoolExecutor task sums what a Manager's queue brings until it reads None; the
producer part was never written, so nothing is ever put: the task's get() waits for ever, and
the parent's result() for it."""
import concurrent.futures
from multiprocessing import Manager


def consume(q):
    total = 0
    while True:
        item = q.get()
        if item is None:
            return total
        total += item


if __name__ == "__main__":
    with Manager() as manager:
        q = manager.Queue()
        with concurrent.futures.ProcessPoolExecutor(max_workers=2) as ex:
            fut = ex.submit(consume, q)
            # TODO: the producer: q.put(...) for each number, then q.put(None)
            print(fut.result())
