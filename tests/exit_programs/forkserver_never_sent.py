"""A producer started by the fork server forwards what its pipe brings; nothing is ever sent on
the pipe, so it waits for ever, and so does the parent in q.get()."""
import multiprocessing as mp


def produce(q, conn):
    q.put(conn.recv())


if __name__ == "__main__":
    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=produce, args=(q, theirs))
    p.start()
    print(q.get())
    p.join()
