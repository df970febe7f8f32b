"""Consumers run in a ThreadPoolExecutor; the author feeds their queue after the `with` block --
which waits for the consumers first."""
import queue
from concurrent.futures import ThreadPoolExecutor

q = queue.Queue()


def consume(n):
    item = q.get()
    return n, item * 2


if __name__ == "__main__":
    with ThreadPoolExecutor(max_workers=3) as ex:
        results = ex.map(consume, range(3))
    for i in range(3):
        q.put(i)
    print(list(results))
