"""A ThreadPoolExecutor's task passes a gate (a threading.Lock) that the main thread closed
while it set things up, and forgot to open again; the main thread waits for the task's result."""
import concurrent.futures
import threading

gate = threading.Lock()


def fetch(name):
    with gate:               # waits while the gate is closed
        return name.upper()


if __name__ == "__main__":
    gate.acquire()           # closed while setting up ... gate.release() was forgotten
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
        fut = ex.submit(fetch, "a.csv")
        print(fut.result())
