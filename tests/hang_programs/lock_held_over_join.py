"""The parent holds the log's lock while it waits for the worker, which wants to log."""
import multiprocessing as mp


def work(lock, i):
    with lock:
        print(f"worker {i} logging", flush=True)


if __name__ == "__main__":
    lock = mp.Lock()
    with lock:
        print("parent: starting worker", flush=True)
        p = mp.Process(target=work, args=(lock, 1))
        p.start()
        p.join()                    # still holding the lock
