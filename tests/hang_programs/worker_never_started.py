"""Two forked workers square the numbers they get from a module-level queue and put the
results on another (both inherited at fork); the parent waits for both workers' results, but
forgot to start the second."""
import multiprocessing as mp

tasks = mp.Queue()
results = mp.Queue()


def worker():
    for n in iter(tasks.get, None):
        results.put(n * n)


if __name__ == "__main__":
    workers = [mp.Process(target=worker) for _ in range(2)]
    workers[0].start()
    for n in range(4):
        tasks.put(n)
    tasks.put(None)
    got = [results.get() for _ in range(8)]      # expects 2 workers x 4 tasks
    print(got)
