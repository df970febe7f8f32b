"""Workers square numbers and put the results in a queue; the main process collects them."""
import time
from multiprocessing import Process, Queue


def work(numbers, results):
    for n in numbers:
        time.sleep(0.1)             # some computation
        results.put(n * n)


if __name__ == "__main__":
    results = Queue()
    workers = [Process(target=work, args=(range(i, 40, 4), results)) for i in range(4)]
    for w in workers:
        w.start()
    total = []
    time.sleep(0.2)                 # give the workers a head start
    while not results.empty():
        total.append(results.get())
    for w in workers:
        w.join()
    print(f"collected {len(total)} squares, sum {sum(total)}")
