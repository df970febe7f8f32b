"""Worker functions for tests/test_viz_truth.py (importable: spawn cannot pickle test-local ones).

``echo_report``: get a tensor, then send back what a child usually sends -- a small report (a
dict and a list, no tensor) -- and the tensor itself again (a handle re-sent: the parent maps
it already, so nothing is attached on arrival). The same over a Pipe and a SimpleQueue.
"""


def echo_report(inbox, outbox, done):
    t = inbox.get()
    outbox.put({"shape": list(t.shape), "sum": float(t.numpy().sum()), "seen": [1, 2, 3]})
    outbox.put(t)                         # the same storage back: a handle, the parent maps it
    done.wait(30)                         # file_descriptor: the parent may still ask us


def echo_report_pipe(conn):
    t = conn.recv()
    conn.send({"shape": list(t.shape), "seen": [1, 2, 3]})
    conn.send(t)
    conn.recv()                           # stay alive until the parent has fetched the fd


def echo_report_simple(inbox, outbox, done):
    t = inbox.get()
    outbox.put({"shape": list(t.shape), "seen": [1, 2, 3]})
    outbox.put(t)
    done.wait(30)


def stdlib_queue_report(inbox, outbox, done):
    """Same, over the stdlib's Queue, whose feeder thread pickles (the recorder's feeder path)."""
    t = inbox.get()
    outbox.put({"shape": list(t.shape), "seen": [1, 2, 3]})
    outbox.put(t)
    done.wait(30)
