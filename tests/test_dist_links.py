"""mpviz.distributed.links.Watch: has a peer rank's process ended? Asked of real processes.

A rank that waits for a peer which has not connected asks ``Watch.ended``: True makes the wait
raise "Connection closed by peer" at once. So True must mean known: a process whose state /proc
cannot give (here: this process is out of file descriptors, so it cannot open /proc/PID/stat) is
not known to have ended -- the answer is None, and the wait goes on to its timeout.
"""
import os
import subprocess
import sys

import pytest

from mpviz import _proc
from mpviz.distributed.links import Watch

pytestmark = pytest.mark.timeout(60)

OUT_OF_FDS = """
import os, resource, sys
from mpviz import _proc
from mpviz.distributed.links import Watch

pid = int(sys.argv[1])
watch = Watch({1: (pid, _proc.start_time(pid))})
print("readable", watch.ended(1))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
print("out_of_fds", _proc.stat(pid) is None, watch.ended(1))
for fd in held:
    os.close(fd)
print("fds_back", watch.ended(1))
"""


def test_a_live_peer_whose_state_proc_cannot_give_is_unknown_not_ended(tmp_path):
    peer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        (tmp_path / "out_of_fds.py").write_text(OUT_OF_FDS)
        run = subprocess.run([sys.executable, str(tmp_path / "out_of_fds.py"), str(peer.pid)],
                             capture_output=True, text=True, timeout=50)
    finally:
        peer.stdin.close()
        peer.wait(timeout=10)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["readable False", "out_of_fds True None",
                                          "fds_back False"], run.stdout


def test_a_peer_that_ended_has_ended_and_a_pid_given_to_nobody_too():
    peer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    watch = Watch({1: (peer.pid, _proc.start_time(peer.pid)), 2: None})
    assert watch.ended(1) is False
    peer.stdin.close()
    peer.wait(timeout=10)                    # reaped: the pid is no process's now
    assert watch.ended(1) is True
    assert watch.ended(2) is None            # no pid in the store: nobody can say
