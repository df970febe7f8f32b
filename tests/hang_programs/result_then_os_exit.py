"""A worker computes a result and leaves at once with os._exit (skipping the interpreter's
cleanup, to be quick)."""
import os
from multiprocessing import Process, Queue


def work(results):
    results.put(sum(range(1000)))
    os._exit(0)                     # done: leave now


if __name__ == "__main__":
    results = Queue()
    p = Process(target=work, args=(results,))
    p.start()
    p.join()
    print("result:", results.get())
