"""Workers meet at a Barrier between two phases; it was made for three, two were started."""
import multiprocessing as mp


def phase_worker(barrier, i):
    print(f"worker {i}: phase 1 done", flush=True)
    barrier.wait()
    print(f"worker {i}: phase 2", flush=True)


if __name__ == "__main__":
    barrier = mp.Barrier(3)
    workers = [mp.Process(target=phase_worker, args=(barrier, i)) for i in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
