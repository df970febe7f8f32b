"""A spawned worker waits until the parent says "go"; the parent sets "done" instead."""
import multiprocessing as mp


def worker(go):
    go.wait()
    print("working")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    go, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=worker, args=(go,))
    p.start()
    done.set()                  # meant: go.set()
    p.join()
