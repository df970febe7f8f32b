"""Worker threads put their results into a module-level queue; the collector waits for one
result per job. One worker waits for a lock another worker never releases."""
import queue
import threading

results = queue.Queue()
db_lock = threading.Lock()


def fetch(job):
    with db_lock:
        results.put(job * 2)


def fetch_and_keep_lock(job):
    db_lock.acquire()            # forgot to release
    results.put(job * 2)


if __name__ == "__main__":
    workers = [threading.Thread(target=fetch_and_keep_lock, args=(0,))] + \
              [threading.Thread(target=fetch, args=(j,)) for j in (1, 2)]
    for w in workers:
        w.start()
    got = [results.get() for _ in range(3)]
    print(sorted(got))
