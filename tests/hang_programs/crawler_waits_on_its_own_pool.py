"""A crawler on a ThreadPool of 2: each page's task fetches the page's links through the same
pool and waits for them. Two pages at once: both workers wait for link jobs that no worker is
free to run."""
import time
from multiprocessing.pool import ThreadPool

pool = ThreadPool(2)


def fetch(url):
    time.sleep(0.05)                           # stands in for the download
    return f"<html>{url}</html>"


def crawl(url):
    page = fetch(url)
    links = [f"{url}/{i}" for i in range(3)]
    children = pool.map(fetch, links)          # jobs of its own pool: who will run them?
    return page, children


if __name__ == "__main__":
    for page, children in pool.map(crawl, ["a", "b"]):
        print(page, len(children))
