"""A program that hangs: the parent joins a child before taking what the child put.

The child puts one large object (4 MiB) on a Queue and returns. A Queue's put does not write
the pipe itself: a feeder thread does, in the background, and a process that exits first waits
for its feeder to finish writing. A pipe holds only 64 KiB, so the feeder waits for a reader --
and the only reader, the parent, is waiting in join() for the child to exit. Nobody moves.

Run it:   python hang_join.py          (hangs; Ctrl-C to stop it)
          python hang_join.py --fix    (get before join: exits 0)
"""
import multiprocessing as mp
import sys


def produce(q):
    q.put(bytes(4 * 1024 * 1024))        # 4 MiB: far more than a pipe holds


def main():
    fix = "--fix" in sys.argv[1:]
    q = mp.Queue()
    child = mp.Process(target=produce, args=(q,))
    child.start()
    if fix:
        data = q.get()                   # take it first: the child's feeder can finish
        child.join()
    else:
        child.join()                     # waits for the child, which waits for us to get
        data = q.get()
    print(f"got {len(data)} bytes; child exit code {child.exitcode}")


if __name__ == "__main__":
    main()
