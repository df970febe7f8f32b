"""A worker waits for a start signal; the parent gives it once the data is ready. The signal is
a threading.Event (the one the threading docs show), made at the top of the module."""
import sys
import threading
import time
from multiprocessing import get_context

start = threading.Event()


def work():
    start.wait()
    print("working", flush=True)


if __name__ == "__main__":
    method = sys.argv[1] if len(sys.argv) > 1 else "fork"
    p = get_context(method).Process(target=work)
    p.start()
    time.sleep(0.2)          # load the data
    start.set()
    p.join()
