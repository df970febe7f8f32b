"""A logging daemon: it writes every line the main program sends it, until the program ends."""
import time
from multiprocessing import Process, Queue


def log_server(lines):
    while True:
        print("LOG:", lines.get(), flush=True)


if __name__ == "__main__":
    lines = Queue()
    Process(target=log_server, args=(lines,), daemon=True).start()
    lines.put("started")
    time.sleep(0.5)                 # the main program's work
    print("collected what it needed")
