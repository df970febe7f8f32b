"""Two children wait for work that never comes, inside ``mpviz.trace.record()``: press Ctrl-C.

Ctrl-C in a terminal (and Jupyter's interrupt) sends SIGINT to the whole foreground process
group: the parent and both children get it. Under ``record()``, the parent first prints where
everyone is (each process's stack, what it waits for), then ends the children; the
KeyboardInterrupt goes on. Every wait is bounded: left alone, the children give up after 30 s.

Run it:   python interrupt_recorded.py       (then Ctrl-C)
"""
import multiprocessing as mp

import mpviz.trace
from mpviz.examples.debugging import ready_then_wait


def main():
    ctx = mp.get_context("spawn")
    queue, ready = ctx.Queue(), ctx.Queue()
    with mpviz.trace.record():
        workers = [ctx.Process(target=ready_then_wait, args=(ready, queue, 30.0),
                               name=f"worker-{i}") for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            ready.get(timeout=30)            # both children are waiting now
        print("ready", flush=True)
        for w in workers:
            w.join()


if __name__ == "__main__":
    main()
