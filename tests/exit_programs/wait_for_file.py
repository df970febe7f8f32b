"""A worker waits for an input file that never comes; the main program waits for the worker.

Nothing is stuck for good (the file may still appear), so the hang watchdog says nothing: this is
the program a learner interrupts with Ctrl-C to ask "where is everyone?".
"""
import multiprocessing as mp
import os
import sys
import time


def wait_for_input(path):
    while not os.path.exists(path):
        time.sleep(0.2)          # poll until the input is there
    print("got", path)


if __name__ == "__main__":
    worker = mp.Process(target=wait_for_input, args=(sys.argv[1],), name="reader")
    worker.start()
    print("waiting for the reader", flush=True)
    worker.join()
