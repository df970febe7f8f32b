"""Threads, not processes: a producer thread reads files into a queue.Queue, a consumer
thread counts their words, and a None says "no more".

The second file does not exist: the producer raises before it puts the None. The consumer's
get() waits for ever, and the main thread's join of it with it.
"""
import queue
import threading


def producer(q, paths):
    for path in paths:
        with open(path) as f:
            q.put(f.read())
    q.put(None)                      # no more


def consumer(q):
    while (text := q.get()) is not None:
        print(len(text.split()), "words")


if __name__ == "__main__":
    with open("a.txt", "w") as f:
        f.write("one two three")
    q = queue.Queue()
    threads = [threading.Thread(target=producer, args=(q, ["a.txt", "b.txt"])),
               threading.Thread(target=consumer, args=(q,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
