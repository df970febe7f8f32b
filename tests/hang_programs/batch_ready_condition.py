"""A loader process waits until the parent says a batch is ready. The parent and the loader
share `ready`, a threading.Condition made at the top of the module, as in the threading docs'
producer/consumer example."""
import sys
import threading
import time
from multiprocessing import get_context

ready = threading.Condition()


def load():
    with ready:
        ready.wait()
    print("loading the batch", flush=True)


if __name__ == "__main__":
    method = sys.argv[1] if len(sys.argv) > 1 else "fork"
    loader = get_context(method).Process(target=load)
    loader.start()
    time.sleep(0.3)            # the batch is being prepared
    with ready:
        ready.notify_all()
    loader.join()
