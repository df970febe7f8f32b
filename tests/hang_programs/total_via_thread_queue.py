"""A worker sums a chunk and hands the total back on a queue.Queue -- the thread-safe queue
of the standard library, which looks like the right tool. The parent waits for the total."""
import multiprocessing as mp
import queue


def worker(chunk, results):
    results.put(sum(chunk))


if __name__ == "__main__":
    mp.set_start_method("fork")
    results = queue.Queue()
    p = mp.Process(target=worker, args=(range(1_000_000), results))
    p.start()
    print("total:", results.get())
    p.join()
