"""Each worker process downloads one page and puts its size on `sizes`, a queue.Queue made at the
top of the module; the parent adds them up. (The sleep stands in for the network: a download
takes a couple of seconds.)"""
import queue
import sys
import time
from multiprocessing import get_context

PAGES = ["https://example.org/a", "https://example.org/b"]
sizes = queue.Queue()


def download(url):
    time.sleep(2.5)                 # fetching the page
    sizes.put((url, 1024))


if __name__ == "__main__":
    ctx = get_context(sys.argv[1] if len(sys.argv) > 1 else "spawn")
    workers = [ctx.Process(target=download, args=(url,)) for url in PAGES]
    for w in workers:
        w.start()
    total = sum(sizes.get()[1] for _ in PAGES)
    for w in workers:
        w.join()
    print("downloaded", total, "bytes")
