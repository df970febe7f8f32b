"""A worker doubles what it reads from a Manager's queue until it reads None; the parent puts
five numbers and joins it -- but forgot ``q.put(None)``. The worker's get() waits for ever, and
so does the join. (issue 27's mgrq.py: the Manager's own polling loop must not be taken for a
loop of the program's that may still end it.)"""
from multiprocessing import Manager, Process


def worker(q, results):
    while True:
        item = q.get()
        if item is None:
            break
        results.put(item * 2)


if __name__ == '__main__':
    with Manager() as manager:
        q = manager.Queue()
        results = manager.Queue()
        p = Process(target=worker, args=(q, results))
        p.start()
        for i in range(5):
            q.put(i)
        # forgot q.put(None)
        p.join()
