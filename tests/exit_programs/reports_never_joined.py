"""Start a worker that reports its progress on a queue; show the first report and finish.

The program never joins the worker: multiprocessing does, at exit -- while the worker, exiting
too, waits for its feeder thread to write the reports nobody reads into the full pipe.
"""
import multiprocessing as mp


def worker(q):
    for i in range(5000):
        q.put(f"step {i} done")


if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=worker, args=(q,))
    p.start()
    print("first report:", q.get())
