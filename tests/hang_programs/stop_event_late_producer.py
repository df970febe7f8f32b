"""The stop-Event worker again, with a second process that feeds it: a producer that reads a
slow source (here, a sleep) and puts its last jobs late. The parent sets the Event and joins the
worker while the producer still sleeps: no cycle -- the producer may still put, and then the
worker's get() returns (and it sees the Event). Not a deadlock: stalled, for as long as the
producer sleeps."""
import multiprocessing as mp
import time


def worker(jobs, results, stop):
    while not stop.is_set():
        n = jobs.get()
        results.put(n * n)


def producer(jobs):
    time.sleep(30)                # a slow source
    jobs.put(5)


if __name__ == "__main__":
    jobs, results, stop = mp.Queue(), mp.Queue(), mp.Event()
    p = mp.Process(target=worker, args=(jobs, results, stop))
    feed = mp.Process(target=producer, args=(jobs,))
    p.start()
    feed.start()
    for n in range(5):
        jobs.put(n)
    print(sorted(results.get() for _ in range(5)), flush=True)
    stop.set()
    p.join()
    feed.join()
