"""The multiprocessing docs' example of ``multiprocessing.connection.wait``, with the one line
its comment explains left out: the parent never closes the write end ``w`` it gave each child.

Each child sends its ten messages and closes its copy of ``w``; but the parent still holds all
four write ends, so no read end ever reaches its end of file: once the 40 messages are read,
``wait(readers)`` waits for ever.
"""
import sys
from multiprocessing import Pipe, Process, current_process, set_start_method
from multiprocessing.connection import wait


def foo(w):
    for i in range(10):
        w.send((i, current_process().name))
    w.close()


if __name__ == '__main__':
    if len(sys.argv) > 1:
        set_start_method(sys.argv[1])
    readers = []

    for i in range(4):
        r, w = Pipe(duplex=False)
        readers.append(r)
        p = Process(target=foo, args=(w,))
        p.start()

    while readers:
        for r in wait(readers):
            try:
                msg = r.recv()
            except EOFError:
                readers.remove(r)
            else:
                print(msg)
