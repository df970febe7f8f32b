"""The author read that fork is unsafe with threads and chose forkserver; a worker decodes a
file with a C library that crashes on it (ctypes reading a bad pointer stands in for the
library's bug). The parent waits for the result on a Queue: a crashed process puts nothing, and
under forkserver the fork server, not the parent, is the worker's parent -- it reaps it at once."""
import ctypes
import multiprocessing as mp

BAD_POINTER = 0xFFFF_FFFF_FFFF_0000     # (kernel space: never readable by a program)


def decode(path, q):
    header = ctypes.string_at(BAD_POINTER, 16)   # the C library's bug
    q.put((path, len(header)))


if __name__ == "__main__":
    mp.set_start_method("forkserver")
    q = mp.Queue()
    p = mp.Process(target=decode, args=("frame_0001.raw", q))
    p.start()
    print(q.get())
    p.join()
