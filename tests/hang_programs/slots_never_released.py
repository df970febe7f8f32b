"""Workers wait for one of the free slots -- but the semaphore was made with none."""
import multiprocessing as mp


def worker(slots, i):
    slots.acquire()
    print(f"worker {i} got a slot", flush=True)


if __name__ == "__main__":
    slots = mp.Semaphore(0)         # meant: Semaphore(2)
    ps = [mp.Process(target=worker, args=(slots, i)) for i in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
