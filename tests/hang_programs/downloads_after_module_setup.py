"""Each worker process downloads one page and puts its size on `sizes`, a queue.Queue made at the
top of the module, beside the table of word ids every page is indexed with, built when the module
is imported; the parent adds the sizes up. (The sleep stands in for the network.)"""
import hashlib
import queue
import sys
import time
from multiprocessing import get_context

PAGES = ["https://example.org/a", "https://example.org/b"]
sizes = queue.Queue()


def build_word_ids(n=4_000_000):
    ids = set()
    for i in range(n):
        ids.add(hashlib.md5(b"word%d" % i).hexdigest()[:6])
    return ids


WORD_IDS = build_word_ids()


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
