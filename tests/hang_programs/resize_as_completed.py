"""Resize every image in worker processes; print each as it finishes. One task waits for a
lock the parent took to guard the log and never released (an early return)."""
import concurrent.futures as cf
import multiprocessing as mp


def resize(name):
    with log_lock:                  # the initializer's lock: the parent still holds it
        print("resizing", name)
    return name.upper()


def init(lock):
    global log_lock
    log_lock = lock


def main():
    lock = mp.Lock()
    lock.acquire()                  # "log the start" -- the release() was lost in an edit
    names = ["a.png", "b.png", "c.png"]
    with cf.ProcessPoolExecutor(max_workers=2, initializer=init, initargs=(lock,)) as ex:
        futs = {ex.submit(resize, n): n for n in names}
        for fut in cf.as_completed(futs):
            print(futs[fut], "->", fut.result())


if __name__ == "__main__":
    main()
