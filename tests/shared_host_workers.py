"""Workers for test_shared_host.py (spawned children import them from here)."""
import os
import sys
import time


def exit_when_told(i, base):
    """Say we started, wait (bounded) until the other side says "go", then exit with status 2
    (as a worker does on a bad setting: ``sys.exit(2)`` writes no traceback anywhere)."""
    open(os.path.join(base, "started"), "w").close()
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(base, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)        # polling a file another user's process makes, bounded
    sys.exit(2)
