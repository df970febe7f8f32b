"""A sensor thread reads a value every 3 s and puts it on a queue.Queue; a logger thread writes
each reading; the main thread puts a header first, then waits for the logger to finish."""
import queue
import threading
import time


def sensor(q):
    for i in range(10):
        time.sleep(3)                  # the next reading
        q.put(f"reading {i}: {20 + i} C")
    q.put(None)


def logger(q):
    while (line := q.get()) is not None:
        print(line, flush=True)


if __name__ == "__main__":
    q = queue.Queue()
    q.put("-- readings --")
    threads = [threading.Thread(target=sensor, args=(q,)), threading.Thread(target=logger, args=(q,))]
    for t in threads:
        t.start()
    threads[1].join()
    threads[0].join()
