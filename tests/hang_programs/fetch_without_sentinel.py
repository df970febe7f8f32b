"""Threads, not processes: three threads fetch pages from a queue.Queue that the main thread
fills. The author waits with q.join() -- then, to be tidy, joins the threads too; but the
threads loop on q.get() for ever, and nobody told them to stop (no sentinel)."""
import queue
import threading
import time


def fetch(q, sizes):
    while True:
        url = q.get()
        time.sleep(0.05)                      # the download
        sizes.append(len(url))
        q.task_done()


if __name__ == "__main__":
    q, sizes = queue.Queue(), []
    workers = [threading.Thread(target=fetch, args=(q, sizes)) for _ in range(3)]
    for w in workers:
        w.start()
    for i in range(10):
        q.put(f"https://example.org/page/{i}")
    q.join()
    print("fetched", len(sizes), "pages", flush=True)
    for w in workers:
        w.join()
