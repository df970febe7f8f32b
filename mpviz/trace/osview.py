"""What the operating system itself says about a process, to cross-check the recorded events.

The recorder writes down what mpviz and multiprocessing *did*; Linux's ``/proc`` shows what *is*:

    /proc/PID/maps   one line per mapping; a shared-memory segment appears as its path,
                     ``/dev/shm/NAME`` (file_system strategy) or ``/memfd:NAME (deleted)``
                     (file_descriptor strategy: an anonymous file that has no name in /dev/shm)
    /proc/PID/fd     one symbolic link per open file descriptor

so ``os_view(pid).shm`` should list the segments the trace says ``pid`` attached and has not
detached, and ``nfds`` grows by one per tensor shared with the file_descriptor strategy.
Linux only: elsewhere ``os_view`` raises ``OSError`` saying so.
"""
import os
from typing import NamedTuple


class OSView(NamedTuple):
    pid: int
    shm: tuple        # names of /dev/shm segments mapped (without the /dev/shm/ prefix)
    memfd: tuple      # names of memfd segments mapped (without "memfd:" and " (deleted)")
    nfds: int         # number of open file descriptors


def os_view(pid=None):
    """Read ``/proc/PID/maps`` and ``/proc/PID/fd`` of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else int(pid)
    base = f"/proc/{pid}"
    if not os.path.isdir("/proc/self"):
        raise OSError("os_view needs Linux's /proc file system, which this system does not have")
    try:
        with open(f"{base}/maps") as f:
            lines = f.read().splitlines()
        nfds = len(os.listdir(f"{base}/fd"))
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid} (it exited, or never existed)") from None
    shm, memfd = [], []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.startswith("/dev/shm/"):
            name = path[len("/dev/shm/"):].removesuffix(" (deleted)")
            if name not in shm:
                shm.append(name)
        elif path.startswith("/memfd:"):
            name = path[len("/memfd:"):].removesuffix(" (deleted)")
            if name not in memfd:
                memfd.append(name)
    return OSView(pid, tuple(shm), tuple(memfd), nfds)
