"""A ProcessPoolExecutor's initializer hands each worker a lock that the parent still holds;
the task takes it, and the parent waits for the task's result. (issue 27's futs.py.)"""
import concurrent.futures
import multiprocessing as mp


def task(n):
    lock.acquire()          # the initializer's lock: nobody releases it
    return n


def init(l):
    global lock
    lock = l


if __name__ == '__main__':
    l = mp.Lock()
    l.acquire()
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, initializer=init,
                                                initargs=(l,)) as ex:
        fut = ex.submit(task, 3)
        print(fut.result())
