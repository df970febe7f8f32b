"""Workers for test_shared_host.py (spawned children import them from here)."""
import os
import time


def fail_when_told(i, base):
    """Say we started, wait (bounded) until the other side says "go", then fail."""
    open(os.path.join(base, "started"), "w").close()
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(base, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)        # polling a file another user's process makes, bounded
    raise ValueError("the child's own error")
