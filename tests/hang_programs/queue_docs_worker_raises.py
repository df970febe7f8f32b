"""The queue module docs' example, as a learner adapts it: a daemon worker thread takes items
from a queue.Queue, the main thread waits with q.join() -- and the worker raises on one item,
before its task_done(); q.join() waits for ever."""
import queue
import threading

q = queue.Queue()


def worker():
    while True:
        item = q.get()
        print(f'Working on {item}', flush=True)
        print(f'Share of {item}: {100 // (7 - item)}', flush=True)
        q.task_done()


# Turn-on the worker thread.
threading.Thread(target=worker, daemon=True).start()

# Send ten task requests to the worker.
for item in range(10):
    q.put(item)

# Block until all tasks are done.
q.join()
print('All work completed')
