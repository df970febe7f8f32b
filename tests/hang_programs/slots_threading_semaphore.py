"""A worker waits for a slot; the parent hands slots out as data arrives. The slots are a
threading.Semaphore that starts at 0."""
import sys
import threading
import time
from multiprocessing import get_context

slots = threading.Semaphore(0)


def work():
    slots.acquire()
    print("got a slot", flush=True)


if __name__ == "__main__":
    method = sys.argv[1] if len(sys.argv) > 1 else "fork"
    p = get_context(method).Process(target=work)
    p.start()
    time.sleep(0.2)          # the data arrives
    slots.release()
    p.join()
