"""mpviz/_proc.py reads /proc for everyone, with one answer when /proc cannot answer: None.

Real processes: a live child, the same child as a zombie (exited, not reaped), and then gone.
"""
import os
import signal
import sys
import time

import pytest

from mpviz import _proc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _wait_until(check, seconds=10):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"not so within {seconds} s"
        time.sleep(0.005)


def test_a_live_child_then_its_zombie_then_nothing():
    r, w = os.pipe()
    pipe = os.fstat(r).st_ino
    pid = os.fork()
    if pid == 0:                                   # the child: wait to be told, then exit 3
        os.close(w)
        os.read(r, 1)
        os._exit(3)
    os.close(r)
    try:
        assert f"pipe:[{pipe}]" in _proc.open_files(pid).values()
        assert _proc.pipes_read({pipe}, [pid, os.getpid()]) == {pipe: [pid]}   # we only write
        st = _proc.stat(pid)
        assert _proc.alive(st) and st.ppid == os.getpid() and st.session == os.getsid(0)
        assert st.group == os.getpgid(0) and st.cpu_seconds >= 0
        assert _proc.start_time(pid) == st.start >= _proc.stat(os.getpid()).start
        assert _proc.cmdline(pid) == _proc.cmdline(os.getpid())      # a fork: the same argv
        assert pid in _proc.pids() and _proc.threads(pid) == [pid]   # a fork has one thread
        assert _proc.stat(pid, pid).ppid == os.getpid() and st.exit_status == 0
        os.write(w, b"x")                          # now it exits; unreaped, it is a zombie
        _wait_until(lambda: _proc.stat(pid).state in ("Z", "X"))
        assert not _proc.alive(_proc.stat(pid))
        assert _proc.start_time(pid) is None       # a zombie has no life left to tell apart
        assert _proc.stat(pid).exit_status == 3 << 8               # what waitpid will say
    finally:
        os.close(w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    # reaped: every reader gives the one answer, None (and alive() takes it)
    assert _proc.stat(pid) is None and _proc.start_time(pid) is None
    assert _proc.cmdline(pid) is None and not _proc.alive(_proc.stat(pid))
    assert _proc.threads(pid) is None and _proc.stat(pid, pid) is None
    assert _proc.open_files(pid) is None and _proc.pipes_read({pipe}, [pid]) == {}


def test_a_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    # /proc/PID/stat puts the command's name in parentheses, and a name may hold ") (": the
    # fields are read after the LAST ")". A thread name is what prctl sets; set it in a child.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            import ctypes
            ctypes.CDLL(None).prctl(15, b"a) (b c) 9 9", 0, 0, 0)     # PR_SET_NAME
        finally:
            os.write(w, b"x")
            signal.pause()
    try:
        os.read(r, 1)
        with open(f"/proc/{pid}/stat") as f:
            assert ") (b c) 9 9)" in f.read()
        st = _proc.stat(pid)
        assert st.ppid == os.getpid() and st.state in ("S", "R")
    finally:
        os.close(r)
        os.close(w)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
