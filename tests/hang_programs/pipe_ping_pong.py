"""The Pipe example of the multiprocessing docs, turned round: both ends recv() first.

Run as ``python pipe_ping_pong.py [fork|spawn|forkserver]`` (default: the platform's).
"""
import sys
from multiprocessing import Pipe, Process, set_start_method


def f(conn):
    msg = conn.recv()
    conn.send(msg + 1)
    conn.close()


if __name__ == '__main__':
    if len(sys.argv) > 1:
        set_start_method(sys.argv[1])
    parent_conn, child_conn = Pipe()
    p = Process(target=f, args=(child_conn,))
    p.start()
    print(parent_conn.recv())   # waits for the child, which waits for us
    p.join()
