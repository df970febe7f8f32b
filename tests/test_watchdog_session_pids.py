"""The hang watchdog's list of the program's processes (``watchdog.SessionPids``): the same as a
full walk of /proc by session, at a fraction of the reads -- it skips the processes it already
found outside the session. What it must not miss: an orphan the program left (re-parented, still
in the session), and a process started after it began looking (a pid it has not seen)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mpviz.trace.session import session_pids
from mpviz.trace.watchdog import SessionPids

# A program in a session (and process group) of its own: an orphaned grandchild at once, then a
# child per line "fork" on stdin; the children wait for a signal, the program for stdin's end.
PROGRAM = textwrap.dedent("""
    import os, signal, sys

    def child():
        if os.fork() == 0:
            signal.pause()
            os._exit(0)

    first = os.fork()
    if first == 0:             # the grandchild's parent exits: it is re-parented, an orphan
        child()
        os._exit(0)
    os.waitpid(first, 0)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "fork":
            child()
            print("forked", flush=True)
""")


def _wait_until(check, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(60)
def test_the_watchdogs_session_pids_find_an_orphan_and_a_later_child_as_a_full_walk_does():
    p = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    look = SessionPids(p.pid)
    try:
        assert p.stdout.readline().strip() == "ready"
        first = look()
        assert first == sorted(session_pids(p.pid))
        assert p.pid in first and len(first) == 2, first   # the program and the orphan
        assert os.getpid() not in first
        look()                                  # (the machine's other processes now known)
        p.stdin.write("fork\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "forked"
        later = look()
        assert later == sorted(session_pids(p.pid)) and len(later) == 3, later
        assert set(first) < set(later)          # the child forked after the first look
    finally:
        os.killpg(p.pid, signal.SIGTERM)      # the children, the orphan too: one group
        p.stdin.close()
        p.wait(timeout=10)
    assert _wait_until(lambda: look() == [] and session_pids(p.pid) == [])
