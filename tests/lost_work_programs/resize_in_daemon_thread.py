"""Resize images in a background thread; the main program queues them."""
import queue
import threading
import time

jobs = queue.Queue()
done = []


def resizer():
    while True:
        name = jobs.get()
        time.sleep(0.05)            # resize it
        done.append(name)
        jobs.task_done()


if __name__ == "__main__":
    threading.Thread(target=resizer, daemon=True).start()
    for i in range(20):
        jobs.put(f"img{i}.png")
    print("queued 20 images")
