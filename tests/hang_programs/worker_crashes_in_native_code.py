"""A worker calls into native code that crashes (here ctypes reading a bad pointer stands in for a
C extension's bug); the parent waits for its result on a Queue for ever: a crashed process puts
nothing, and its parent never waits for it, so nobody says how it ended."""
import ctypes
import multiprocessing as mp

BAD_POINTER = 0xFFFF_FFFF_FFFF_0000     # (kernel space: never readable by a program)


def worker(q):
    header = ctypes.string_at(BAD_POINTER, 16)   # a C library's bug
    q.put(len(header))


if __name__ == "__main__":
    q = mp.Queue()
    p = mp.Process(target=worker, args=(q,))
    p.start()
    print(q.get())
    p.join()
