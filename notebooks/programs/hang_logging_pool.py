"""A program that hangs now and then: Pool workers forked while a logging thread runs.

The parent logs through a ``QueueHandler`` (records go on a ``queue.Queue``; a
``QueueListener`` thread writes them to a file), and a thread named ``write_logs`` logs a
heartbeat in a loop. Then, for each batch of work, it starts a ``Pool`` -- with the default
start method on Linux, ``fork``. fork copies the parent's memory, locks included, but only the
thread that called it: if ``write_logs`` was inside ``queue.Queue.put`` at that instant, the
queue's lock is copied *held*, and in the child no thread exists that will ever release it. The
worker's first ``log.info`` waits on it for ever, and the Pool waits for that worker's job.
(The listener writes to os.devnull: a run that hangs is killed, and would leave its log file.)

Run it:   python hang_logging_pool.py          (hangs within a few of its 40 batches; Ctrl-C)
          python hang_logging_pool.py --fix    (forkserver workers: fresh locks; exits 0)
          ... --batches N                      (N batches instead of 40)
"""
import logging
import logging.handlers
import multiprocessing as mp
import os
import queue
import sys
import threading
import time

log = logging.getLogger("work")


def square(n):
    log.info("worker %d squares %d", os.getpid(), n)
    return n * n


def write_logs(stop):
    """A heartbeat: what a service's monitoring thread does."""
    beat = 0
    while not stop.is_set():
        beat += 1
        log.debug("heartbeat %d", beat)


def main():
    fix = "--fix" in sys.argv[1:]
    batches = int(sys.argv[sys.argv.index("--batches") + 1]) if "--batches" in sys.argv else 40
    records = queue.Queue()
    # (a service writes a file; os.devnull here: a run that hangs is killed, and would leave it)
    listener = logging.handlers.QueueListener(records, logging.FileHandler(os.devnull))
    listener.start()
    logging.basicConfig(level=logging.DEBUG, handlers=[logging.handlers.QueueHandler(records)])
    stop = threading.Event()
    threading.Thread(target=write_logs, args=(stop,), name="write_logs", daemon=True).start()
    context = mp.get_context("forkserver" if fix else "fork")
    for batch in range(batches):
        with context.Pool(8) as pool:
            total = sum(pool.map(square, range(batch * 16, batch * 16 + 16)))
        print(f"batch {batch}: {total}", flush=True)
    stop.set()
    listener.stop()
    print("all batches done", flush=True)


if __name__ == "__main__":
    main()
