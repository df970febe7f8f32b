"""Each worker sends back its result with the open file it wrote to: a file cannot be pickled.
put() returns at once -- the queue's feeder thread pickles later, and fails there."""
import multiprocessing as mp


def work(q, n):
    f = open(f"part{n}.txt", "w")
    f.write("x" * n)
    q.put({"n": n, "file": f})


if __name__ == "__main__":
    q = mp.Queue()
    procs = [mp.Process(target=work, args=(q, n)) for n in range(2)]
    for p in procs:
        p.start()
    parts = [q.get() for _ in procs]
    for p in procs:
        p.join()
    print(parts)
