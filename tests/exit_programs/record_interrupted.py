"""A notebook cell's program, run as a script: the learner records it, it waits for ever, and
they interrupt it (Jupyter's "interrupt the kernel" sends SIGINT to the kernel's process group).

The bug: the worker waits for tasks, the main process waits for results, and nobody sends a
task. ``record()`` has no watchdog here (no hang_after): the Ctrl-C is the diagnosis.
"""
import multiprocessing as mp
import sys

from mpviz.trace import record


def square_all(tasks, results):
    while True:
        x = tasks.get()                      # wait for the next number
        results.put(x * x)


if __name__ == "__main__":
    if len(sys.argv) > 2:                    # the test's: a start method (3.14's default: forkserver)
        mp.set_start_method(sys.argv[2])
    with record(sys.argv[1]) as trace:
        tasks, results = mp.Queue(), mp.Queue()
        worker = mp.Process(target=square_all, args=(tasks, results), name="squarer")
        worker.start()
        print("waiting for the first result", flush=True)
        print(results.get())                 # nobody put a task: waits for ever
