"""Fetch pages with a ThreadPool (the work waits on the network, so threads will do); the
lengths are read when they are needed."""
import time
from multiprocessing.pool import ThreadPool


def fetch(url):
    time.sleep(0.5)                 # the request
    return len(url) * 100


if __name__ == "__main__":
    urls = ["https://example.org/a", "https://example.org/b", "https://example.org/c"]
    with ThreadPool(2) as pool:
        lengths = pool.map_async(fetch, urls)
    print("fetched", sum(lengths.get()), "bytes")
