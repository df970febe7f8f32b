"""A worker process squares numbers until it gets None (the sentinel). The parent sends five
numbers, reads the five squares -- and joins, forgetting to send the None."""
import multiprocessing as mp


def worker(jobs, results):
    for n in iter(jobs.get, None):
        results.put(n * n)


if __name__ == "__main__":
    jobs, results = mp.Queue(), mp.Queue()
    p = mp.Process(target=worker, args=(jobs, results))
    p.start()
    for n in range(5):
        jobs.put(n)
    print(sorted(results.get() for _ in range(5)), flush=True)
    p.join()
