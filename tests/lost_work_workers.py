"""Children for tests/test_lost_work.py (module level, so spawn and forkserver can import them)."""


def parse(path):
    """Count the characters of a file -- one that is missing raises FileNotFoundError."""
    with open(path) as f:
        return len(f.read())


def take_until_none(q):
    """Get tasks from `q` until a None says there are no more."""
    while q.get() is not None:
        pass


def slow_square(x):
    """x * x, after a while (a slow computation)."""
    import time
    time.sleep(0.3)
    return x * x
