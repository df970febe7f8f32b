"""The same, collecting as many results as were asked for: nothing is left behind."""
import time
from multiprocessing import Process, Queue


def work(numbers, results):
    for n in numbers:
        time.sleep(0.01)            # some computation
        results.put(n * n)


if __name__ == "__main__":
    results = Queue()
    workers = [Process(target=work, args=(range(i, 40, 4), results)) for i in range(4)]
    for w in workers:
        w.start()
    while results.empty():          # wait for the first result
        time.sleep(0.01)
    total = [results.get() for _ in range(40)]
    for w in workers:
        w.join()
    print(f"collected {len(total)} squares, sum {sum(total)}")
