# Seed 003, "Sharing CUDA tensors": the bad-practice example. Only the imports are changed.
import mpviz as torch
import mpviz.multiprocessing as mp
import time

def foo(q):
    q.put(torch.randn(20, 20).cuda())
    time.sleep(2)

def bar(q):
    tensor = q.get()
    time.sleep(2) #  delibrately sleep to make sure that foo is done
    print(f"Received {tensor.size()}")

if __name__ == "__main__":
    mp.set_start_method('spawn')

    queue = mp.Queue()
    p1 = mp.Process(target=foo, args=(queue,))
    p2 = mp.Process(target=bar, args=(queue,))

    p1.start()
    p2.start()

    p1.join()
    p2.join()
