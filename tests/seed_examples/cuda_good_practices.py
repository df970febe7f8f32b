# Seed 004, best practices 1 and 2 put together: the consumer releases its tensor as soon as it
# is done (`del x`), and the producer keeps running until the consumer says so (`event.wait()`).
# Only the imports differ from torch.
import mpviz as torch
import mpviz.multiprocessing as mp


def producer(queue, event):
    # send tensors, do something
    queue.put(torch.randn(20, 20).cuda())
    event.wait()


def consumer(queue, event):
    # receive tensors and use them
    x = queue.get()
    print(f"Received {x.size()}, all finite: {bool(x.abs().sum().item() < float('inf'))}")
    del x
    event.set()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    queue, event = mp.Queue(), mp.Event()
    p1 = mp.Process(target=producer, args=(queue, event))
    p2 = mp.Process(target=consumer, args=(queue, event))
    p1.start()
    p2.start()
    p1.join()
    p2.join()
