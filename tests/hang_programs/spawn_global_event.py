"""A worker waits for a stop signal made at module level. Under spawn the child imports this
module again -- and makes an Event of its own, which nobody sets."""
import multiprocessing as mp
import time

stop = mp.Event()


def worker():
    stop.wait()
    print("worker stopping")


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    p = mp.Process(target=worker)
    p.start()
    time.sleep(0.5)
    stop.set()
    p.join()
