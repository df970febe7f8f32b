"""A worker process takes jobs from a multiprocessing Queue until a stop Event is set. The
author sets the Event, then joins the worker -- but the worker checks the Event only between
jobs, and is blocked in q.get() on an empty queue: nobody will put again."""
import multiprocessing as mp


def worker(jobs, results, stop):
    while not stop.is_set():
        n = jobs.get()
        results.put(n * n)


if __name__ == "__main__":
    jobs, results, stop = mp.Queue(), mp.Queue(), mp.Event()
    p = mp.Process(target=worker, args=(jobs, results, stop))
    p.start()
    for n in range(5):
        jobs.put(n)
    print(sorted(results.get() for _ in range(5)), flush=True)
    stop.set()
    p.join()
