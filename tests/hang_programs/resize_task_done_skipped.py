"""Workers resize images from a JoinableQueue and call task_done() after each; one image is
corrupt: the worker raises before its task_done(), and the parent's q.join() waits for ever."""
import multiprocessing as mp


def worker(q):
    while True:
        name = q.get()
        if name.endswith("3.png"):
            raise ValueError(f"corrupt image: {name}")
        q.task_done()


if __name__ == "__main__":
    q = mp.JoinableQueue()
    for i in range(6):
        q.put(f"img{i}.png")
    for _ in range(2):
        mp.Process(target=worker, args=(q,), daemon=True).start()
    q.join()                       # until every image is done
    print("all resized")
