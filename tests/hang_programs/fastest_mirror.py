"""Ask three mirrors at once and keep the first answer. The main thread guards the cache
with its lock while it waits -- and each fetch takes the same lock to read the cache first."""
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

MIRRORS = ["eu.example.org", "us.example.org", "asia.example.org"]
cache = {}
cache_lock = threading.Lock()


def fetch(mirror):
    with cache_lock:                       # "someone may have fetched it already"
        if "index" in cache:
            return cache["index"]
    return f"index from {mirror}"


def main():
    with ThreadPoolExecutor(max_workers=3) as ex:
        with cache_lock:                   # keep the cache still until the first answer
            futures = [ex.submit(fetch, m) for m in MIRRORS]
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            cache["index"] = done.pop().result()
    print(cache["index"])


if __name__ == "__main__":
    main()
