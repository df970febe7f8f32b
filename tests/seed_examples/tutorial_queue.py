# Seed 003 (tutorial), "Cross-process communication". Changed: the import line only.
import mpviz.multiprocessing as mp
import time

def foo(x, q):
    # Producer
    print(f"Putting {x} in queue")
    q.put(x)

def bar(q):
    # Consumer
    print(f"Got {q.get()} from queue")

queue = mp.Queue()

p1 = mp.Process(target=foo, args=(1, queue))
p2 = mp.Process(target=bar, args=(queue,))

p1.start()
p2.start()

p1.join()
p2.join()
