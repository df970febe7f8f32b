"""A worker runs while `running` is set; the parent pauses it (clear) to look at the results
and then joins it -- it forgot to resume it (set) or to tell it to stop."""
import multiprocessing as mp
import time


def worker(running, done):
    for step in range(100):
        running.wait()                 # paused while cleared
        with done.get_lock():
            done.value += 1
        time.sleep(0.01)


if __name__ == "__main__":
    running = mp.Event()
    done = mp.Value("i", 0)
    running.set()
    p = mp.Process(target=worker, args=(running, done))
    p.start()
    time.sleep(0.3)
    running.clear()                    # pause, to read the results
    print("steps so far:", done.value)
    p.join()                           # forgot: running.set() first
