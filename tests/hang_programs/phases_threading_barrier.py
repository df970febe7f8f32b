"""Two worker processes meet at a barrier before the second phase: a threading.Barrier made at
the top of the module, as the threading docs show one."""
import threading
from multiprocessing import get_context

both_ready = threading.Barrier(2)


def phase(n):
    print("phase 1 done", n, flush=True)
    both_ready.wait()
    print("phase 2", n, flush=True)


if __name__ == "__main__":
    ctx = get_context("fork")
    workers = [ctx.Process(target=phase, args=(n,)) for n in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
