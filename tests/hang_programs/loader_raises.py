"""A worker reads a file and sends its lines back; the file is missing, so the worker raises
(its traceback is printed) -- and the parent waits for the lines."""
import multiprocessing as mp


def load(path, q):
    with open(path) as f:
        q.put(f.read().splitlines())


if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=load, args=("/nonexistent/data.txt", q))
    p.start()
    lines = q.get()
    p.join()
    print(len(lines))
