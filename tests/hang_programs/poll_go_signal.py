"""A worker waits for a go signal, checking every second, and gives up after a minute; nobody
ever sets the signal. The program ends by itself after a minute: not "nobody can ever move"."""
import multiprocessing as mp
import time


def worker(go):
    deadline = time.monotonic() + 60
    while not go.wait(timeout=1):
        if time.monotonic() > deadline:
            print("gave up", flush=True)
            return
        print("still waiting", flush=True)


if __name__ == "__main__":
    go = mp.Event()
    p = mp.Process(target=worker, args=(go,))
    p.start()
    p.join()
