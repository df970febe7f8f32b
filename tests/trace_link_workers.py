"""Children for tests/test_trace_links.py (module level, so spawn and forkserver can import them)."""
import mpviz.trace as mt


def produce(q, tag, sizes):
    for i, n in enumerate(sizes):
        mt.mark("put", tag=tag, i=i)
        q.put((tag, i, b"m" * n))


def consume(q, done, n):
    """Get until the end marker (two consumers share the work); report how many."""
    count = 0
    while True:
        item = q.get(timeout=60)
        if item is None:
            break
        tag, i, _ = item
        mt.mark("got", tag=tag, i=i)
        count += 1
    done.put(count)


def echo(inbox, outbox, n):
    for _ in range(n):
        tag, i = inbox.get(timeout=30)
        outbox.put(("pong", i))
