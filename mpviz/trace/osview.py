"""What the operating system itself says about a process, to cross-check the recorded events.

The recorder writes down what mpviz and multiprocessing *did*; Linux's ``/proc`` shows what *is*:

    /proc/PID/maps   one line per mapping; a shared-memory segment appears as its path,
                     ``/dev/shm/NAME`` (file_system strategy) or ``/memfd:NAME (deleted)``
                     (file_descriptor strategy: an anonymous file that has no name in /dev/shm)
    /proc/PID/fd     one symbolic link per open file descriptor ("pipe:[123]": both ends of
                     a pipe read so; /proc/PID/fdinfo/FD's flags say which end: pipe_ends)

so ``os_view(pid).shm`` should list the segments the trace says ``pid`` attached and has not
detached, and ``nfds`` grows by one per tensor shared with the file_descriptor strategy.
Linux only: elsewhere ``os_view`` raises ``OSError`` saying so.
"""
import os
import signal
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


# --- threads: is each one running, waiting with a deadline, or waiting for ever? ---------------
#
# The hang watchdog (watchdog.py) judges every thread of every watched process from three files:
#
#   /proc/PID/task/TID/schedstat   CPU nanoseconds it ran, how many times it was put on a CPU
#                                  (that count moves each time a wait of it ends)
#   /proc/PID/task/TID/syscall     the system call it is blocked in and its six arguments
#                                  (see proc(5)); "running" when it is not in one
#   /proc/PID/task/TID/wchan       the kernel function it sleeps in (futex_wait_queue, ...)
#
# The system call says what the thread waits for, and whether the wait has a deadline:
#
#   clock_nanosleep, nanosleep          time.sleep(t)                      deadline
#   futex WAIT with a timeout pointer   lock.acquire(timeout=t), Event.wait(t)   deadline
#   futex WAIT, timeout NULL            lock.acquire(), join(), Event.wait()     for ever
#   poll/epoll_wait timeout >= 0 (ms)   Connection.poll(t), Queue.get(timeout=t) deadline
#   ppoll/select/pselect6 timeout ptr   select.select(..., t)              deadline (NULL: for ever)
#   read, write, accept, recv..., wait4 a pipe, a socket, a child          for ever
#
# A futex with FUTEX_PRIVATE_FLAG (128) lives in this process's own memory: only a thread of the
# same process can wake it. (A multiprocessing Lock's semaphore is shared memory: not private.)
# Linux only, x86_64 and aarch64 (other machines: every wait reads as "unknown").

_SYSCALLS = {      # number: (name, where its timeout is: ("ms", arg) an int, ("ptr", arg), None)
    "x86_64": {0: ("read", None), 1: ("write", None), 7: ("poll", ("ms", 2)),
               23: ("select", ("ptr", 4)), 35: ("nanosleep", "sleep"),
               43: ("accept", None), 45: ("recvfrom", None), 47: ("recvmsg", None),
               44: ("sendto", None), 46: ("sendmsg", None), 61: ("wait4", None),
               202: ("futex", ("ptr", 3)), 230: ("clock_nanosleep", "sleep"),
               232: ("epoll_wait", ("ms", 3)), 247: ("waitid", None),
               270: ("pselect6", ("ptr", 4)), 271: ("ppoll", ("ptr", 2)),
               281: ("epoll_pwait", ("ms", 3)), 288: ("accept4", None),
               441: ("epoll_pwait2", ("ptr", 3))},
    "aarch64": {63: ("read", None), 64: ("write", None), 73: ("ppoll", ("ptr", 2)),
                72: ("pselect6", ("ptr", 4)), 101: ("nanosleep", "sleep"),
                115: ("clock_nanosleep", "sleep"), 202: ("accept", None),
                207: ("recvfrom", None), 212: ("recvmsg", None), 206: ("sendto", None),
                211: ("sendmsg", None), 260: ("wait4", None), 95: ("waitid", None),
                98: ("futex", ("ptr", 3)), 22: ("epoll_pwait", ("ms", 3)),
                242: ("accept4", None), 441: ("epoll_pwait2", ("ptr", 3))},
}
_MACHINE = os.uname().machine     # (asked once: a system call, and the watchdog reads a
                                  # thread's syscall file many times a second)
_FUTEX_WAITS = {0, 9, 6, 11}      # FUTEX_WAIT, _WAIT_BITSET, _LOCK_PI, _WAIT_REQUEUE_PI
_FUTEX_PRIVATE = 128


class ThreadView(NamedTuple):
    pid: int
    tid: int
    state: str         # R running, S sleeping, D in the disk/kernel, T stopped, Z ...
    cpu_ns: int        # CPU time it has used
    runs: int          # times it was put on a CPU: moves whenever a wait of it ends
    call: str          # the system call it waits in ("running", "unknown", "futex", ...)
    args: tuple        # that call's six arguments (ints)
    wait: str          # "running", "deadline", "forever", "sleep" (a deadline: time itself),
                       # "terminal" (reading a terminal: waits for you), "unknown"
    private: bool      # a futex wait only a thread of this same process can end
    wchan: str         # the kernel function it sleeps in: "" (read only for a verdict: wchan())

    @property
    def key(self):
        """What it waits on: the call and the argument that names the thing (a lock's address,
        an fd; for poll/ppoll the number of fds -- their array is on the stack, which moves)."""
        if self.wait == "running":
            return None
        return (self.call, self.args[1:2] if self.call in ("poll", "ppoll") else self.args[:1])


def threads(pid, before=None):
    """A ``ThreadView`` of each thread of process `pid` ([] when it has gone).

    `before`: ``{tid: ThreadView}`` from the last look. A thread that has not run since (same
    CPU time and run count in its schedstat) is where it was: its view is reused, and only one
    small file is read for it -- the watchdog looks 10 times a second at every thread."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    out = []
    for tid in tids:
        old = (before or {}).get(tid)
        if old is not None and old.wait != "running":
            sched = _read(f"/proc/{pid}/task/{tid}/schedstat")
            if sched and sched.split()[0:3:2] == [str(old.cpu_ns), str(old.runs)]:
                out.append(old)
                continue
        view = _thread(pid, tid)
        if view is not None:
            out.append(view)
    return out


def thread_name(pid, tid):
    """A thread's name as the kernel knows it (its comm: 15 bytes at most), or ""."""
    return (_read(f"/proc/{pid}/task/{tid}/comm") or "").strip()


def wchan(pid, tid):
    """The kernel function thread `tid` sleeps in ("" when running, or unreadable)."""
    text = (_read(f"/proc/{pid}/task/{tid}/wchan") or "").strip()
    return "" if text == "0" else text


def ended_unwaited(pid, ppid=None):
    """``(exitcode, signal name or None)`` of process `pid` if it has ended and its parent has
    not waited for it yet -- a zombie keeps its exit status for that wait (/proc/PID/stat: state
    Z, and its exit_code field, Linux 3.5+) -- else None. `ppid`: the parent it must have (a pid
    reused by another process is not the one asked about)."""
    fields = (_read(f"/proc/{pid}/stat") or ")").rsplit(")", 1)[1].split()
    if len(fields) < 50 or fields[0] != "Z" or (ppid is not None and int(fields[1]) != ppid):
        return None
    status = int(fields[49])
    if status & 0x7F:                                      # ended by a signal
        try:
            name = signal.Signals(status & 0x7F).name
        except ValueError:
            name = f"signal {status & 0x7F}"
        return -(status & 0x7F), name
    return (status >> 8) & 0xFF, None


def _read(path, size=4096):
    """The text of a small /proc file, or None. ``os.open``/``os.read``, not ``open()``: half
    the cost (11 against 23 µs), and the watchdog reads thousands of these a second. `size`:
    how much one read asks for (a /proc table: see _tcp_peer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        parts = []
        while True:
            part = os.read(fd, size)
            if not part:
                return b"".join(parts).decode(errors="replace")
            parts.append(part)
    except OSError:
        return None
    finally:
        os.close(fd)


def _thread(pid, tid):
    base = f"/proc/{pid}/task/{tid}"
    stat, sched = _read(f"{base}/stat"), _read(f"{base}/schedstat")
    if stat is None:
        return None
    try:
        state = stat.rsplit(")", 1)[1].split()[0]
    except IndexError:
        return None
    cpu_ns, runs = 0, 0
    if sched:
        fields = sched.split()
        cpu_ns, runs = int(fields[0]), int(fields[2])
    else:                                   # no schedstat: CPU ticks, and no run count
        fields = stat.rsplit(")", 1)[1].split()
        cpu_ns = (int(fields[11]) + int(fields[12])) * 10_000_000
    call, args, wait, private = _syscall(pid, (_read(f"{base}/syscall") or "").split())
    if state == "R":
        wait = "running"
    return ThreadView(pid, tid, state, cpu_ns, runs, call, args, wait, private, "")


def _syscall(pid, fields):
    """(call, args, wait, private) from the fields of /proc/PID/task/TID/syscall."""
    if not fields or fields[0] == "running":
        return "running", (), "running", False
    table = _SYSCALLS.get(_MACHINE)
    try:
        number, args = int(fields[0]), tuple(int(a, 16) for a in fields[1:7])
    except ValueError:
        return "unknown", (), "unknown", False
    if table is None or number not in table or len(args) < 6:
        return (f"syscall {number}" if number >= 0 else "unknown"), args, "unknown", False
    call, timeout = table[number]
    if timeout == "sleep":
        return call, args, "sleep", False
    if call == "futex":
        op = args[1]
        if op & 0x7f not in _FUTEX_WAITS:
            return call, args, "unknown", False
        wait = "deadline" if args[3] else "forever"
        return call, args, wait, bool(op & _FUTEX_PRIVATE) and wait == "forever"
    if timeout is None:
        if call == "read" and _is_terminal(pid, args[0]):
            return call, args, "terminal", False
        return call, args, "forever", False
    how, where = timeout
    if how == "ms":
        value = args[where] & 0xffffffff                      # an int: -1 means no deadline
        value = value - (1 << 32) if value >= 1 << 31 else value
        return call, args, "forever" if value < 0 else "deadline", False
    return call, args, "deadline" if args[where] else "forever", False


def _is_terminal(pid, fd):
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    return target.startswith(("/dev/pts/", "/dev/tty"))


def pipe_ends(pids, target):
    """``{"read": [pid, ...], "write": [pid, ...]}``: which of `pids` hold pipe `target`
    ("pipe:[123]", as ``fd_target`` says it) open for reading, for writing (its fdinfo's
    access mode). A pipe's two ends are one inode: who holds which is only said by the flags."""
    ends = {"read": [], "write": []}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            if fd_target(pid, fd) != target:
                continue
            info = _read(f"/proc/{pid}/fdinfo/{fd}") or ""
            flags = next((int(line.split()[1], 8) for line in info.splitlines()
                          if line.startswith("flags:")), None)
            if flags is None:
                continue
            for end, modes in (("read", (os.O_RDONLY, os.O_RDWR)),
                               ("write", (os.O_WRONLY, os.O_RDWR))):
                if flags & 3 in modes and pid not in ends[end]:
                    ends[end].append(pid)
    return ends


def fd_target(pid, fd):
    """What fd `fd` of `pid` is: "pipe:[123]", a path, "socket:[...]" ("" if unknown)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""


# --- the other end of a connected socket -----------------------------------------------------
#
# A ``Listener``/``Client`` connection is a socket whose other end another process holds. Each
# side names its own end by its inode (waits.end_id) and the other end by the other socket's
# inode, which Linux tells without asking the other process:
#
#     AF_UNIX   sock_diag (netlink, as `ss -x` asks): UNIX_DIAG_PEER of our socket's inode
#     AF_INET   /proc/net/tcp[6]: the socket whose local address is our peer's and whose
#               peer is us (the other end, on this machine)

def peer_socket_inode(fd):
    """The inode of the socket at the other end of the connected socket `fd`, or None where
    Linux does not say (another machine's, a closed one, no sock_diag); 0 for a TCP end on this
    machine that its listener has not accepted yet (/proc/net/tcp shows it with inode 0)."""
    import socket
    sock = socket.socket(fileno=os.dup(fd))
    try:
        if sock.family == socket.AF_UNIX:
            return _unix_peer(os.fstat(fd).st_ino)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return _tcp_peer(sock.family, sock.getsockname()[:2], sock.getpeername()[:2])
        return None
    except OSError:
        return None
    finally:
        sock.close()


def _unix_peer(inode):
    import socket
    import struct
    sock_diag, by_family, request, show_peer, peer = 4, 20, 1, 4, 2
    query = struct.pack("=BBHIII2I", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, show_peer,
                        0xFFFFFFFF, 0xFFFFFFFF)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, sock_diag)
    try:
        nl.settimeout(1.0)
        nl.send(struct.pack("=IHHII", 16 + len(query), by_family, request, 1, 0) + query)
        data = nl.recv(65536)
    finally:
        nl.close()
    length, kind = struct.unpack_from("=IH", data)
    if kind != by_family:
        return None                     # an error message: no such socket, or not allowed
    at = 16 + 16                        # after the netlink header and unix_diag_msg
    while at + 4 <= min(length, len(data)):
        size, attribute = struct.unpack_from("=HH", data, at)
        if attribute == peer and size >= 8:
            return struct.unpack_from("=I", data, at + 4)[0]
        if size < 4:
            break
        at += (size + 3) & ~3
    return None


def _tcp_peer(family, local, remote):
    import socket
    path = "/proc/net/tcp" if family == socket.AF_INET else "/proc/net/tcp6"
    want = (_tcp_address(family, remote), _tcp_address(family, local))
    # In reads of 1 MiB: the kernel fills each read with as many lines as fit, and between
    # two reads of a few KiB (what open() asks) a table that changes -- other connections
    # made, closed -- can skip a line (a fresh-clone test run: a Client's connection not found)
    for line in (_read(path, 1 << 20) or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and (fields[1], fields[2]) == want:
            return int(fields[9])
    return None


def same_host_peer(fd):
    """Is the other end of connected socket `fd` on this machine: an AF_UNIX socket, or a TCP
    one whose peer's address is a loopback one or our own?"""
    import ipaddress
    import socket
    sock = socket.socket(fileno=os.dup(fd))
    try:
        if sock.family == socket.AF_UNIX:
            return True
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        peer = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
        return peer.is_loopback or sock.getpeername()[0] == sock.getsockname()[0]
    except (OSError, ValueError):
        return False
    finally:
        sock.close()


def _tcp_address(family, address):
    """`address` (host, port) as /proc/net/tcp writes it: the address's 32-bit words in this
    machine's byte order, in hex, then ':' and the port."""
    import socket
    import sys
    raw = socket.inet_pton(family, address[0])
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    if sys.byteorder == "little":
        words = [w[::-1] for w in words]
    return "".join(w.hex().upper() for w in words) + f":{address[1]:04X}"
