"""A torch program: a producer puts a few 256 KiB tensors on a torch Queue, a consumer sums them.

torch.multiprocessing's Queue does not pickle a tensor's bytes: put moves the tensor's storage
into shared memory (one copy) and sends a small handle; the consumer maps the same memory.
How the handle names that memory depends on the sharing strategy:

    file_descriptor (Linux's default)   an fd, handed over by the producer on a Unix socket
    file_system                         a name in /dev/shm (torch_...)

Run it:   python torch_queue.py                    (file_descriptor)
          python torch_queue.py file_system
"""
import sys

import torch
import torch.multiprocessing as mp

N, ELEMENTS = 4, 64 * 1024              # 4 tensors of 64 Ki float32 = 256 KiB each


def produce(q, done):
    sent = []                            # keep what was sent: each stays mapped here too
    for i in range(N):
        sent.append(torch.full((ELEMENTS,), float(i)))
        q.put(sent[-1])
    done.wait()                          # stay alive until the consumer has them all


def main():
    strategy = sys.argv[1] if len(sys.argv) > 1 else "file_descriptor"
    mp.set_sharing_strategy(strategy)
    q, done = mp.Queue(), mp.Event()
    producer = mp.Process(target=produce, args=(q, done))
    producer.start()
    got = [q.get() for _ in range(N)]    # each maps the producer's memory: no bytes copied
    total = sum(t.sum().item() for t in got)
    done.set()
    producer.join()
    print(f"{strategy}: got {N} tensors of {ELEMENTS * 4 // 1024} KiB, sum {total:.0f}")


if __name__ == "__main__":
    main()
