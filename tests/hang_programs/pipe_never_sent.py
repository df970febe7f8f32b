"""A worker was to send its answer back through a one-way Pipe, and forgot to.

The parent still holds the Pipe's write end itself (it made the Pipe and never closed that
end), so its recv() never sees an end of file: it waits for ever.
"""
from multiprocessing import Pipe, Process


def worker(send_end, n):
    total = sum(i * i for i in range(n))
    print("worker: the sum of squares is", total)     # ... but never send_end.send(total)


if __name__ == "__main__":
    recv_end, send_end = Pipe(duplex=False)
    p = Process(target=worker, args=(send_end, 1000))
    p.start()
    print("answer:", recv_end.recv())
    p.join()
