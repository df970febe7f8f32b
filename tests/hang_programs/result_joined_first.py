"""A worker computes a big result and sends it back over a Pipe; the parent joins it first."""
import multiprocessing as mp


def compute(conn):
    result = list(range(1_000_000))
    conn.send(result)
    conn.close()


if __name__ == "__main__":
    parent_conn, child_conn = mp.Pipe()
    p = mp.Process(target=compute, args=(child_conn,))
    p.start()
    p.join()                        # wait for the worker to finish...
    print(len(parent_conn.recv()))  # ...then read its result
