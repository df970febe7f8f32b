"""A worker waits for a go signal, checking every few seconds (``python wait_go_signal.py 5``:
every 5 s), and gives up after a minute; nobody ever sets the signal. The program ends by itself
after that minute -- a loop that polls may give up."""
import multiprocessing as mp
import sys
import time

EVERY = float(sys.argv[1]) if len(sys.argv) > 1 else 5


def worker(go):
    deadline = time.monotonic() + 60
    while not go.wait(timeout=EVERY):
        if time.monotonic() > deadline:
            print("gave up", flush=True)
            return
        print("still waiting", flush=True)


if __name__ == "__main__":
    go = mp.Event()
    p = mp.Process(target=worker, args=(go,))
    p.start()
    p.join()
