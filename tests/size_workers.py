"""Workers for test_timeline_sizes.py (importable, so that any start method can run them)."""
import mpviz.trace as mt


def echo_and_mark(inbox, outbox, n, marks):
    """Send back each of `n` items; mark `marks` steps on the way (a training loop's marks)."""
    for i in range(marks):
        mt.mark("step", i=i)
    for _ in range(n):
        outbox.put(inbox.get())
