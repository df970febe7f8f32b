"""A worker waits for a go signal, checking every 5 s, and gives up after a minute; nobody
ever sets it. Within --hang-after its wait has a deadline still to come: a stall."""
import multiprocessing as mp
import time


def worker(go):
    deadline = time.monotonic() + 60
    while not go.wait(timeout=5):
        if time.monotonic() > deadline:
            print("gave up", flush=True)
            return
        print("still waiting", flush=True)


if __name__ == "__main__":
    go = mp.Event()
    p = mp.Process(target=worker, args=(go,))
    p.start()
    p.join()
