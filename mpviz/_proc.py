"""What Linux's /proc says about one process: read in one place, answered one way.

    /proc/PID/stat     "PID (comm) S PPID PGRP SID ... UTIME STIME ... STARTTIME ... EXIT"
                        the command's name may hold spaces and ")": split after the LAST ")"
    /proc/PID/task/    one directory per thread, each with a stat of the same form
    /proc/PID/cmdline  the arguments, each ended by a NUL byte

**One answer when /proc cannot answer.** Every function here that reads one process returns
``None`` when the read fails: the process is gone (or was never there), it is not ours to read,
or this is not Linux (or this process is out of descriptors: a reader that may be, as the shm
manager's daemon, keeps some free). :func:`pids` raises instead (see there).
What ``None`` means is the caller's to say, at its call site ("gone: the youngest", "gone: not
the owner"), where a reader can see it; the scans over many processes (at the end) leave such a
process out. A zombie (dead, not yet reaped) still has a stat: its
state is "Z" (or "X" as it goes), and a caller that asks "alive?" checks :func:`alive`.

A leaf: it imports nothing of mpviz, so the shm manager's daemon (standard library only) and
the stepper, the launcher and the runner all read /proc through it.
"""
import collections
import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100   # stat's time unit

Stat = collections.namedtuple("Stat", "state ppid group session cpu_seconds start exit_status")
Stat.__doc__ = """Fields of /proc/PID/stat: the state letter ("R", "S", "Z", ...), the parent's
pid, the process group, the session, the CPU time used (user + system, seconds), the start time
(clock ticks since boot: with the pid, it tells a process from a later one given its pid), and
the wait status a zombie keeps for its parent (as os.waitpid gives it; None before Linux 3.5)."""


def stat(pid, tid=None):
    """Process `pid`'s :class:`Stat` (or, with `tid`, its thread `tid`'s); None if /proc cannot
    say (see the top)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # after the name: state(0) ppid(1) pgrp(2) session(3) ... utime(11) stime(12) ...
        # starttime(19) ... exit_code(49): fields 3, 4, 5, 6, 14, 15, 22 and 52 of proc(5),
        # which counts from 1
        return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[3]),
                    (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[19]),
                    int(fields[49]) if len(fields) > 49 else None)
    except (OSError, IndexError, ValueError):
        return None


def alive(st):
    """True for the :class:`Stat` of a live process: not None (gone), not a zombie."""
    return st is not None and st.state not in ("Z", "X")


def start_time(pid):
    """The start time of live process `pid` (clock ticks since boot); None if it is gone or a
    zombie, or /proc cannot say."""
    st = stat(pid)
    return st.start if alive(st) else None


def cmdline(pid):
    """Process `pid`'s command line as raw bytes (arguments ended by NUL); None if /proc cannot
    say."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def threads(pid):
    """The thread ids of process `pid`; None if /proc cannot say."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return None


def open_files(pid):
    """{fd: what it is open on} for process `pid` ("/dev/shm/x", "pipe:[123]", "socket:[9]");
    None if /proc cannot say. A descriptor closed while it is read is left out."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    found = {}
    for fd in fds:
        try:
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return found


def pids():
    """Every pid /proc lists now (a process may be gone by the time it is read). Not None when
    /proc cannot be listed: that says nothing of any process (out of descriptors: EMFILE), so
    the OSError is raised, and no caller takes "no list" for "nobody"."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


# -- many processes at once: one pass over /proc, a process it cannot read left out ------------

def pipes_read(inodes, pids):
    """Which of the pipes `inodes` a process among `pids` has open for reading: {inode: [pid]}
    (a pipe nobody reads is left out). Only our own user's processes can be looked at."""
    found = {}
    if not inodes:
        return found
    wanted = {f"pipe:[{ino}]": ino for ino in inodes}
    for pid in pids:
        for fd, target in (open_files(pid) or {}).items():      # None: gone, or not ours
            ino = wanted.get(target)
            if ino is not None and _reads(pid, fd):
                found.setdefault(ino, []).append(pid)
    return found


def _reads(pid, fd):
    """Whether descriptor `fd` of process `pid` is open for reading (O_RDONLY or O_RDWR)."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_WRONLY
    except (OSError, ValueError):
        pass
    return False


def mappers(names, pids):
    """{name: [pids among `pids` that map it]} for the /dev/shm `names` ("/mpviz_…"): each
    process's maps read once (not once per name: 1,500 names took 25 s that way)."""
    found = {name: [] for name in names}
    if not names:
        return found
    shorts = {"/dev/shm" + name: name for name in names}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:
            continue                       # gone, or not ours
        for line in text.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset device inode [path]
            if len(fields) < 6 or not fields[5].startswith("/dev/shm/"):
                continue
            name = shorts.get(fields[5].removesuffix(" (deleted)"))
            if name is not None and pid not in found[name]:
                found[name].append(pid)
    return found
