"""Notebook 05's program in real torch: producers send batches to one consumer, which sends each
buffer back for reuse (torch's notes: "Reuse buffers passed through a Queue ... make it send the
buffers back"). A plain torch.multiprocessing script; it knows nothing of mpviz.

    python torch_buffer_reuse.py reuse     each producer fills 2 buffers in place, again and again
    python torch_buffer_reuse.py fresh     a new tensor for every batch

Each producer sends 8 batches of 64 KiB (16 Ki float32). The default start method (fork before
Python 3.14) and sharing strategy (file_descriptor on Linux).
"""
import sys

import torch
import torch.multiprocessing as mp

PRODUCERS, BATCHES, NUMEL, POOL = 3, 8, 16 * 1024, 2


def producer(rank, q, back, reuse, done):
    free = [torch.zeros(NUMEL) for _ in range(POOL)] if reuse else []
    for i in range(BATCHES):
        if reuse:
            buf = free.pop() if free else back.get()    # a buffer the consumer sent back
            buf.fill_(float(i))                         # in place: it stays in shared memory
        else:
            buf = torch.full((NUMEL,), float(i))        # a new tensor: moved into shm by put
        q.put((rank, i, buf))
        del buf
    q.put((rank, None, None))
    for _ in range(POOL - len(free) if reuse else 0):   # wait until every buffer is home
        back.get()
    done.wait()          # file_descriptor: a sender must outlive the gets of its handles


def main():
    reuse = (sys.argv[1] if len(sys.argv) > 1 else "reuse") == "reuse"
    q, done = mp.Queue(), mp.Event()
    backs = [mp.Queue() for _ in range(PRODUCERS)]
    procs = [mp.Process(target=producer, args=(r, q, backs[r], reuse, done))
             for r in range(PRODUCERS)]
    for p in procs:
        p.start()
    running, received = PRODUCERS, 0
    while running:
        rank, i, buf = q.get()
        if i is None:
            running -= 1
            continue
        received += 1
        if reuse:
            backs[rank].put(buf)         # done with it: home it goes, as a handle
        del buf
    done.set()
    for p in procs:
        p.join()
    for queue in [q] + backs:
        queue.close()
        queue.join_thread()
    print(f"reuse={reuse}: the consumer got {received} batches of {NUMEL * 4 // 1024} KiB; "
          f"exit codes {[p.exitcode for p in procs]}")


if __name__ == "__main__":
    main()
