"""Worker functions for the recorder's tests (importable: spawn cannot pickle test-local ones).

They use only the stdlib and ``mpviz.trace`` so that they do not depend on the tensor core; where
a test wants shared-memory events the worker emits them itself, as the core would.
"""
import os
import signal
import threading

from mpviz.trace import mark, recorder


class Payload:
    """A user object that must come out of a queue exactly as it went in."""

    def __init__(self, i):
        self.i = i

    def __eq__(self, other):
        return type(other) is Payload and other.i == self.i


def producer(q, n, segment):
    recorder.emit("shm.create", name=segment, strategy="file_system", nbytes=4096)
    for i in range(n):
        q.put(Payload(i))
    q.put(None)


def consumer(q, results, segment):
    recorder.emit("shm.attach", name=segment, strategy="file_system", nbytes=4096)
    got = []
    while True:
        item = q.get()
        if item is None:
            break
        got.append(item.i if type(item) is Payload else ("wrong type", repr(item)))
        mark("got", i=got[-1])
    recorder.emit("shm.detach", name=segment, strategy="file_system", nbytes=4096)
    results.put(got)


def marks_then_sigkill(n):
    for i in range(n):
        mark("tick", i=i)
    os.kill(os.getpid(), signal.SIGKILL)


def marks_then_wait(n, ready, go):
    for i in range(n):
        mark("tick", i=i)
    ready.set()
    go.wait()


def square(x):
    return x * x


def contend(lock, got_it):
    """Block on `lock` (the parent holds it), then report."""
    with lock:
        got_it.set()


def in_a_thread(n):
    t = threading.Thread(target=lambda: [mark("in thread", i=i) for i in range(n)],
                         name="helper")
    t.start()
    t.join()


def produce(q, tag, sizes):
    """Put one message per size, each marked just before its put (test_trace_links)."""
    for i, n in enumerate(sizes):
        mark("put", tag=tag, i=i)
        q.put((tag, i, b"m" * n))


def consume(q, done):
    """Get until the end marker (two consumers share the work), marking each get; report how
    many (test_trace_links)."""
    count = 0
    while True:
        item = q.get(timeout=60)
        if item is None:
            break
        tag, i, _ = item
        mark("got", tag=tag, i=i)
        count += 1
    done.put(count)


def ping(inbox, outbox, n):
    for _ in range(n):
        outbox.put(inbox.get())


def echo(conn, n):
    for _ in range(n):
        conn.send(conn.recv())


def put_on_both(stdlib_q, mpviz_q, n):
    """n puts on each queue, alternating (message ids from one counter: see messages.next_msg)."""
    for i in range(n):
        stdlib_q.put(i)
        mpviz_q.put(i)
