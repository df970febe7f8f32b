"""Workers add to a shared counter under a lock; the parent starts them and waits for them while
holding the lock, so that nothing reads the counter half-updated."""
import multiprocessing as mp


def add_one(lock, counter):
    with lock:
        counter.value += 1


if __name__ == "__main__":
    lock = mp.Lock()
    counter = mp.Value("i", 0, lock=False)
    workers = [mp.Process(target=add_one, args=(lock, counter)) for _ in range(3)]
    with lock:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    print("count:", counter.value)
