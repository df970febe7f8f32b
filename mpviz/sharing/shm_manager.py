"""The shm manager: a small daemon that removes ``file_system`` segments nobody alive holds.

Why: a ``file_system`` segment is freed by whoever drops its count to 0 (see
:mod:`mpviz.sharing.file_system`). A process killed by SIGKILL drops nothing, so its segments
would stay in /dev/shm, using RAM, until reboot. The manager watches instead::

    process A ──"HOLD /mpviz_1 1"──▶ ┌──────────────┐   A dies (SIGKILL): its socket closes, the
    process B ──"HOLD /mpviz_1 1"──▶ │  shm manager │   manager drops A's holds. A name that no
    process A ──"DROP /mpviz_2"────▶ │ (own session)│   connected process holds, and that no
                                     └──────────────┘   handle in flight names, is unlinked.

* One per user (and ``MPVIZ_SHM_TAG``), double-forked and ``setsid()``, stdio on /dev/null,
  none of the tracer's environment (``python -I -S``). A line per map or unmap (:class:`_Client`).
* **Only its own user.** Its socket is a file in ``/tmp/mpviz-<uid>/`` (0700, checked, never a
  followed link; ``MPVIZ_SHM_MANAGER_DIR`` moves it); each side checks the other's uid with
  ``SO_PEERCRED`` (an abstract name, as before, anyone could take first). torch's does the same.
* **Bad clients cannot break it**: bounded ASCII lines, bounded reads, ``UNLINKED`` believed only
  if the name is gone, fd limits raised or refused with a reason (see ``MAX_LINE``, :func:`serve`).
* **Handles in flight are read from the segment's header** (``check_in_flight`` in :func:`serve`; :func:`fate`);
  a manager that was killed is followed by one that *adopts* the names it finds in /dev/shm.
* Idle for ``IDLE_SECONDS``: it unlinks what it knows and exits. Off: ``MPVIZ_SHM_MANAGER=0``.

Adapted from torch's ``libshm`` (``torch_shm_manager``), which cleans up when all clients are
gone; mpviz also cleans up after each dead client. This file is the client (as a module) and the
daemon (as a script), standard library only so the daemon starts fast.
"""
import errno
import fcntl
import hashlib
import os
import re
import resource
import selectors
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings

IDLE_SECONDS = 1.0
CHECK_SECONDS = 1.0     # how often names in flight are looked at again (a scan of /proc)
BATCH_SECONDS = 0.001   # see serve(): longer, and a busy client fills its socket buffer and waits
MAX_LINE = 1024         # bytes: a message is a word and a name of at most 255 bytes
READ_PER_ROUND = 1 << 20  # bytes read from one client per round: a flood cannot grow us
MAX_NAMES = 1 << 16     # names one client may hold (a process cannot map more: vm.max_map_count)
REFUSED_SECONDS = 10.0  # a refused client tries again after this long
_ENV = "MPVIZ_SHM_MANAGER"
_ENV_DIR = "MPVIZ_SHM_MANAGER_DIR"

# The header of a file_system segment, as far as the manager reads it (file_system writes it:
# see the picture there). This file uses only the standard library, so the layout lives here.
_HEADER = struct.Struct("=qq6q")    # count, roads claimed, 6 road slots
ROADS_AT, SLOTS_AT, SLOTS = 8, 16, 6
UNKNOWN_ROAD = -1                   # a slot's value for a road mpviz cannot name

PROTOCOL = 5  # in the address: a manager that speaks older lines never serves newer clients


class ManagerUnsafe(RuntimeError):
    """Raised when the shm manager's private directory, or the process listening at its socket,
    is not this user's: another user could read every segment name this program shares, or
    make it wait. The message names what was found and how to fix it."""


_ON, _OFF_WORDS = ("", "1", "on", "true", "yes"), ("0", "off", "false", "no")


def _setting(value):
    """``MPVIZ_SHM_MANAGER`` as a bool; a value that is neither on nor off is refused."""
    word = (value or "").strip().lower()
    if word in _ON or word in _OFF_WORDS:
        return word not in _OFF_WORDS
    raise ValueError(f"{_ENV}={value!r} is neither on nor off: it switches the shm manager, which "
                     f"removes the segments of killed processes. Fix: {_ENV}=0 (or off) to see "
                     f"the leak, {_ENV}=1 (or unset it) to have them removed.")


def runtime_directory():
    """The manager's private directory: ``/tmp/mpviz-<uid>`` (``$MPVIZ_SHM_MANAGER_DIR`` instead
    of /tmp if set). Fixed, not ``$TMPDIR``: every process of a program must find the same
    manager, whatever each one's environment says."""
    base = os.environ.get(_ENV_DIR) or "/tmp"
    if not os.path.isabs(base):
        raise ValueError(f"{_ENV_DIR}={base!r} is not an absolute path: each process would find "
                         f"a manager of its own working directory, and each would remove what "
                         f"the others hold. Fix: an absolute path, e.g. {_ENV_DIR}=/tmp")
    return os.path.join(base, f"mpviz-{os.getuid()}")


def _private_directory():
    """Create (0700) or check the private directory; raise ManagerUnsafe if it is not ours."""
    path = runtime_directory()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)!r})"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o077:
        problem = f"is open to other users (mode {stat.S_IMODE(st.st_mode):o}, not 700)"
    else:
        return path
    raise ManagerUnsafe(
        f"the shm manager's private directory {path} {problem}: another user may have made it "
        f"to read the names of your shared segments or to make your program wait, so mpviz "
        f"will not use it. Fix: have it removed (its owner or root: rm -r {path}); or set "
        f"{_ENV_DIR} to a directory of your own; or {_ENV}=0 to share without the manager "
        f"(the segments of a killed process then stay in /dev/shm).")


def address():
    """The manager's socket file. One manager per user, per ``MPVIZ_SHM_TAG`` (a test run's tag
    gets its own) and per /dev/shm: a container with its own /dev/shm must not reach a manager
    that cannot see (nor unlink) its names. The device number of /dev/shm tells them apart."""
    tag = os.environ.get("MPVIZ_SHM_TAG", "")
    tag = "-" + hashlib.sha1(tag.encode()).hexdigest()[:12] if tag else ""
    try:
        dev = f"-d{os.stat('/dev/shm').st_dev:x}"
    except OSError:
        dev = ""
    path = os.path.join(_private_directory(), f"shm-manager{tag}{dev}-v{PROTOCOL}.sock")
    if len(path.encode()) >= 108:
        raise ValueError(f"{_ENV_DIR}={os.environ.get(_ENV_DIR)!r} is too long: the manager's "
                         f"socket path {path!r} must be under 108 bytes (a Unix socket's "
                         f"limit). Fix: a shorter {_ENV_DIR}, or unset it (/tmp).")
    return path


_enabled = _setting(os.environ.get(_ENV))   # read once: a put asks for every tensor it sends


def enabled():
    """Whether this process reports its segments to the manager (default: yes)."""
    return _enabled


def enable(flag=True):
    """Switch the manager on or off for this process and the children it starts later.
    (Names it was told of while on are still reported, so that it keeps them right.)"""
    global _enabled
    os.environ[_ENV] = "1" if flag else "0"
    _enabled = bool(flag)
    # The connection stays open while switched off: closing it would tell the manager that we
    # died, and it would remove segments we still hold.


# -- the client ---------------------------------------------------------------------------------

class _Client:
    """This process's connection to the manager. Sends lines; never waits for an answer.

    For a file_system name it keeps how many of our mappings count 1 in its header and how many
    do not (one process can map a name twice: the receive cache forgets a Storage that died),
    and tells the manager the new number of counted ones at every change — ``HOLD name N`` — or
    ``DROP name`` once we map it no more. The manager adds that N to its dead counts if we die.

    A line per message, unanswered: ``GROUP g`` (first: my process group), ``HOLD name 1`` (I map
    it, counted), ``HOLD name 0`` (I map it, counted out: a kept mapping), ``HOLD name`` (a
    simulated CUDA block), ``DROP``, ``UNLINKED`` -- sent when a process maps or unmaps, not per
    tensor; a holder says it before it gives its count back (a kill in between errs towards
    keeping). After a reconnect (the manager was killed) it says again everything it holds.
    """

    def __init__(self):
        self.pid = os.getpid()
        self.fd = None  # a raw descriptor: it lives as long as the process, and closes with it
        self.lock = threading.Lock()
        self.mapped = {}    # file_system name -> [mappings counted in its header, not counted]
        self.plain = set()  # names with no count in them (simulated CUDA memory) we hold
        self.refused_until = 0.0   # the manager refused us (out of descriptors): not before then
        self.unsafe = False        # its directory or listener is another user's: raised once

    def change(self, name, counted=0, uncounted=0):
        """`counted`/`uncounted` more (or fewer, if negative) of our mappings of the file_system
        segment `name`. Switched off, it reports only names the manager already knows of."""
        with self.lock:
            now = self.mapped.get(name)
            if now is None:
                if not _enabled:
                    return
                now = self.mapped[name] = [0, 0]
            now[0] += counted
            now[1] += uncounted
            if now[0] > 0 or now[1] > 0:
                self._write(f"HOLD {name} {now[0]}\n")
            else:
                del self.mapped[name]
                self._write(f"DROP {name}\n")

    def hold(self, name):
        """We map `name`, a segment with no count in it: removed once nobody alive holds it."""
        with self.lock:
            if _enabled:
                self.plain.add(name)
                self._write(f"HOLD {name}\n")

    def drop(self, name):
        with self.lock:
            if name in self.plain:
                self.plain.discard(name)
                self._write(f"DROP {name}\n")

    def unlinked(self, name):
        with self.lock:
            if _enabled or name in self.mapped or name in self.plain:
                self._write(f"UNLINKED {name}\n")

    def _everything(self):
        """What a new manager must hear first: our process group (it could read it from /proc
        only while we live, and a sender killed right after its put is gone before it is
        accepted), then every name we hold (a manager that was killed took what we told it)."""
        lines = [f"GROUP {os.getpgrp()}\n"]
        lines += [f"HOLD {name} {n}\n" for name, (n, _) in self.mapped.items()]
        lines += [f"HOLD {name}\n" for name in self.plain]
        return "".join(lines)

    def _write(self, line):
        if self.fd is None:
            if time.monotonic() < self.refused_until:
                return
            if self.unsafe:
                return      # said once (raised): this process shares without the manager
            try:
                self.fd = _connect_or_start().detach()
            except OSError:
                return      # no manager could be started: the next message tries again
            except ManagerUnsafe:
                self.unsafe = True
                raise
            line = self._everything() + line
        data = line.encode()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            reason = _refusal(self.fd)
            os.close(self.fd)
            self.fd = None  # the manager is gone; the next message starts a new one
            if reason:
                self.refused_until = time.monotonic() + REFUSED_SECONDS
                warnings.warn(f"the mpviz shm manager refused this process (pid {os.getpid()}): "
                              f"{reason}", RuntimeWarning, stacklevel=2)


def _refusal(fd):
    """The line a manager that refused us wrote before closing (None if it wrote none)."""
    try:
        data = os.read(fd, MAX_LINE) if _readable(fd) else b""
    except OSError:
        return None
    if data.startswith(b"REFUSED "):
        return data[8:].decode("ascii", "replace").strip()
    return None


def _readable(fd):
    import select
    return bool(select.select([fd], [], [], 0)[0])


class _Off:
    def change(self, name, counted=0, uncounted=0): pass
    def hold(self, name): pass
    def drop(self, name): pass
    def unlinked(self, name): pass


_client = None
_OFF = _Off()


def client():
    """This process's manager client; a do-nothing one while the manager is switched off and
    this process has told it nothing yet. (Switched off after telling it of names, we go on
    telling it about those: it must not count, for a holder that later exits, a count that
    holder gave back while switched off.)"""
    global _client
    if _client is not None and _client.pid != os.getpid():
        _client = None                 # after fork: the parent's isn't ours
    if _client is None:
        if not _enabled:
            return _OFF
        _client = _Client()
    return _client


def _forget_client():
    global _client
    fd = getattr(_client, "fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    _client = None


# Close the parent's connection in a forked child: the manager learns that a process died when
# its connection closes, and a child still holding the parent's would hide the parent's death.
os.register_at_fork(after_in_child=_forget_client)


def _connect_or_start():
    path = address()
    sock = _connect(path)
    if sock is not None:
        return sock
    # Nobody is listening: start the daemon. Two processes racing here is fine: the second
    # daemon finds the lock taken and exits.
    subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__), "--serve"],
                   env=_daemon_environment(), stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   close_fds=True, check=False, timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        time.sleep(0.005)
    raise OSError("the mpviz shm manager did not start")


def _daemon_environment():
    """Ours, less what a daemon must not inherit: the tracer's variables (it would record into
    a trace and keep its files open long after, serving untraced programs too) and Python's
    (``-I`` ignores them; they are dropped so that nothing it could start inherits them)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("MPVIZ_TRACE", "MPVIZ_SCENARIO_STACKS", "PYTHON"))}


def _connect(path):
    """A connection to the manager at `path`, or None if none listens. Raises ManagerUnsafe if
    the process listening there is not of our user (it could only be root, or a directory
    check got round)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    pid, uid, _ = _peer(sock)
    if uid != os.getuid():
        sock.close()
        raise ManagerUnsafe(f"the process listening at the shm manager's socket {path} (pid "
                            f"{pid}) runs as uid {uid}, not as you (uid {os.getuid()}): mpviz "
                            f"tells it nothing. Fix: remove {os.path.dirname(path)}, or set "
                            f"{_ENV_DIR} to a directory of your own.")
    return sock


def _peer(sock):
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))


def infrastructure_fds():
    """The manager connection this process keeps open on purpose (empty if none)."""
    c = _client
    fd = getattr(c, "fd", None) if c is not None and getattr(c, "pid", None) == os.getpid() else None
    return {fd} if fd is not None else set()


# -- the daemon ---------------------------------------------------------------------------------

def _daemonize():
    if os.fork():
        os._exit(0)  # the starter waits only for this first child
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def _listen():
    """Our listening socket, or None when another manager already serves this address. The
    lock file (held while we live, released by the kernel even after a SIGKILL) says who
    serves: a socket file a killed manager left is removed only by the one holding the lock."""
    path = address()
    if not _lock(_lock_path(path)):
        return None
    try:
        os.unlink(path)            # left by a manager that was killed
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    listener.setblocking(False)
    return listener                # (the lock's descriptor stays open: we hold it till we exit)


def _lock_path(path):
    return path[:-len(".sock")] + ".lock"


def _lock(path):
    """Take the lock file `path` for as long as we live; False if another process holds it.
    A manager removes its lock file when it exits (see serve()), so the file we locked must
    still be the one at `path`: else we locked one just removed, and try again."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return True        # (the descriptor stays open: the lock is ours till we exit)
        except FileNotFoundError:
            pass
        os.close(fd)
    return False


def _raise_fd_limit():
    """Raise our soft limit on descriptors to the hard one: each client is one descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass


class _Peer:
    """One client: its pid and process group (a handle's road may be unknown), what it holds
    ({name: how many counts in its header are the client's (0: it maps it, counted out), None:
    a name with no count}), and the part of a line not yet ended."""

    def __init__(self, pid):
        self.pid, self.group = pid, _stat(pid)[1]
        self.holds = {}
        self.buffer = b""
        self.skipping = False      # inside a line longer than MAX_LINE: dropped to its end

    def lines(self, data):
        """The complete lines in `data` (after what came before), each at most MAX_LINE bytes;
        longer ones are dropped whole, so a client cannot make us keep more than that."""
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        if self.skipping and lines:
            lines, self.skipping = lines[1:], False        # the end of the long line
        if len(self.buffer) > MAX_LINE:
            self.buffer, self.skipping = b"", True
        return [line for line in lines if len(line) <= MAX_LINE]


_NAME = re.compile(r"/mpviz_[\x21-\x2e\x30-\x7e]{1,248}")   # printable ASCII, no space, no '/'


def parse(line):
    """(op, name, n) of one message, or None if it is not one we know: ``GROUP g``, ``HOLD name
    [n]``, ``DROP name``, ``UNLINKED name``, ``FATE name``. n is None or 0..2**31."""
    try:
        words = line.decode("ascii").split(" ")
    except UnicodeDecodeError:
        return None
    if len(words) == 2 and words[0] == "GROUP" and words[1].isdigit() and len(words[1]) < 11:
        return "GROUP", None, int(words[1])
    if len(words) == 3 and words[0] == "HOLD" and words[2].isdigit() and len(words[2]) < 10:
        op, name, n = words[0], words[1], int(words[2])
    elif len(words) == 2 and words[0] in ("HOLD", "DROP", "UNLINKED", "FATE"):
        op, name, n = words[0], words[1], None
    else:
        return None
    return (op, name, n) if _NAME.fullmatch(name) else None


def _ours(prefix):
    """The names in /dev/shm of our user that a client of ours makes (``prefix`` + 20 hex
    digits: file_system; ``cuda_``/``cudarc_`` + pid + 12: simulated CUDA), as
    {name: counted?}. A tagged run's names do not match an untagged prefix: hex follows it."""
    found = {}
    shape = re.compile(re.escape(prefix) + r"(?:([0-9a-f]{20})|cuda(?:rc)?_\d+_[0-9a-f]{12})")
    try:
        entries = os.listdir("/dev/shm")
    except OSError:
        return found
    for entry in entries:
        match = shape.fullmatch(entry)
        if match:
            try:
                if os.lstat("/dev/shm/" + entry).st_uid != os.getuid():
                    continue
            except OSError:
                continue
            found["/" + entry] = match.group(1) is not None
    return found


def mappers(names, pids=None):
    """{name: [pids of live processes that map it]} for the /dev/shm `names`: each process's
    maps read once (not once per name: 1,500 names took 25 s that way)."""
    found = {name: [] for name in names}
    if not names:
        return found
    shorts = {"/dev/shm" + name: name for name in names}
    for pid in pids if pids is not None else _pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)  # address perms offset device inode [path]
            if len(fields) < 6 or not fields[5].startswith("/dev/shm/"):
                continue
            name = shorts.get(fields[5].removesuffix(" (deleted)"))
            if name is not None and pid not in found[name]:
                found[name].append(pid)
    return found


def serve():
    listener = _listen()
    if listener is None:
        return  # another manager is already serving this user
    _raise_fd_limit()
    spare = os.open(os.devnull, os.O_RDONLY)   # given up to accept, and refuse, one client
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    peers = {}      # client socket -> _Peer
    counted = set() # names whose header counts holders and handles in flight (file_system)
    dead = {}       # name -> counts in its header that belong to clients that died holding it
    groups = {}     # name -> the process groups of the clients that ever held it
    known = set()   # every name ever mentioned, for the final sweep
    in_flight = {}  # name -> since when nobody holds it, with handles still in flight
    adopted = {}    # name -> pids that mapped it when we found it (a killed manager's names)
    idle_since = last_check = time.monotonic()
    paused_until = 0.0

    def unlink(name):
        try:
            import _posixshmem
            _posixshmem.shm_unlink(name)
        except OSError:
            pass
        forget(name)

    def forget(name):
        known.discard(name)
        counted.discard(name)
        dead.pop(name, None)
        groups.pop(name, None)
        in_flight.pop(name, None)
        adopted.pop(name, None)

    def held(name):
        return name in adopted or any(name in p.holds for p in peers.values())

    def decide(name):
        """For a name nobody alive holds: unlink it, or keep it in flight."""
        if name not in counted:
            return unlink(name)
        header = _header(name)
        if header is None or header[0] - dead.get(name, 0) <= 0:
            return unlink(name)            # no handle in flight: nobody can come for it
        in_flight.setdefault(name, time.monotonic())

    def adopt():
        """A manager killed before us left these names: each is held for the live processes
        that map it. One that nobody maps is judged at the first check (CHECK_SECONDS from now),
        not at once: its creator may be between creating and mapping it."""
        found = _ours("mpviz_" + os.environ.get("MPVIZ_SHM_TAG", ""))
        holders = mappers(list(found))
        for name, has_count in found.items():
            known.add(name)
            if has_count:
                counted.add(name)
            groups[name] = {g for g in (_stat(p)[1] for p in holders[name]) if g is not None}
            adopted[name] = set(holders[name])

    def check_adopted():
        """Adopted names that no live process maps any more are nobody's now (unless a
        client said it holds them since): judged as if their last holder had just gone.
        (Their holders' counts in the header are not known: they count as in flight, and
        go with their holders' process groups, or when no live process can read their
        queue.)"""
        alive = mappers(list(adopted))
        for name in list(adopted):
            adopted[name] = set(alive[name])
            if not adopted[name]:
                del adopted[name]
                if not held(name):
                    decide(name)

    def check_in_flight(now):
        """Names in flight for a while: can a live process still receive one of their handles?
        Every ``CHECK_SECONDS`` each is looked at again (``keep_or_unlink``); one that nobody
        can ever receive is unlinked. So a tensor put on a queue arrives however long after its
        sender died, while anyone can still ``get`` from that queue (a forked child that
        inherited the pipe counts too)."""
        waiting = {}
        for name, since in list(in_flight.items()):
            if held(name):
                del in_flight[name]        # it arrived: its receiver holds it now
            elif now - since >= CHECK_SECONDS:
                header = _header(name)
                if header is None or header[0] - dead.get(name, 0) <= 0:
                    unlink(name)           # its last handle arrived, and was let go
                else:
                    waiting[name] = header
        readers, lives = look_at_proc(waiting)
        for name, header in waiting.items():
            if keep_or_unlink(name, header, readers, lives)[0] == "unreachable":
                unlink(name)               # no live process can ever receive a handle to it

    def look_at_proc(headers):
        """For `headers` ({name: header}): which of their queue pipes a live process reads,
        and which of their holders' process groups live (/proc read once for all)."""
        if not headers:
            return {}, set()
        pipes = set().union(*(roads(header)[0] for header in headers.values()))
        return (pipes_read(pipes),
                groups_alive({g for name in headers for g in groups.get(name, ())}))

    def keep_or_unlink(name, header, readers, lives):
        """For a name nobody alive holds: (kind, handles left in flight, pids that can read its
        queue), kind as decided from the road each sender wrote in the header (the queue pipe's
        inode; -1 for a ``Pipe``, ``SimpleQueue``, ``Pool``)::

            the pipe is named, and a live process has its reading end open   -> "queue": kept
              (/proc/PID/fd/N -> "pipe:[inode]", /proc/PID/fdinfo/N)
            no road named, and a process of a holder's process group lives   -> "group": kept
            otherwise: no live process can ever receive a handle to it       -> "unreachable"
        """
        left = header[0] - dead.get(name, 0)
        pipes, unknown = roads(header)
        pids = sorted({p for ino in pipes for p in readers.get(ino, ())})
        if left > 0 and pids:
            return "queue", left, pids
        if left > 0 and (unknown or not pipes) and groups.get(name, set()) & lives:
            return "group", left, []
        return "unreachable", left, []

    def judge_all(names):
        """Our view of each of `names`, a line each (``FATE``'s answer): what decide() and
        check_in_flight() go by."""
        headers = {name: _header(name) for name in names}
        readers, lives = look_at_proc({n: h for n, h in headers.items() if h is not None})
        answers = []
        for name in names:
            pids = ([p.pid for p in peers.values() if name in p.holds]
                    + sorted(adopted.get(name, ())))
            if pids:
                kind, left = "held", 0
            elif name not in known or headers[name] is None or name not in counted:
                kind, left = "unknown", 0
            else:
                kind, left, pids = keep_or_unlink(name, headers[name], readers, lives)
            answers.append(f"{kind} {left} {','.join(map(str, pids)) or '-'}\n")
        return answers

    def accept():
        """A new client, if it is of our user. Out of descriptors: the spare one is given up
        to take the client, tell it why, and close it (else it would wait, and we would spin
        on a listener that stays readable)."""
        nonlocal spare, paused_until
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                return
            os.close(spare)
            try:
                conn, _ = listener.accept()
                conn.setblocking(False)
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                conn.send(f"REFUSED the shm manager (pid {os.getpid()}) serves {len(peers)} "
                          f"processes and has no descriptor left for more (limit {soft}): this "
                          f"process shares without it, so its segments stay in /dev/shm if it "
                          f"is killed. Fix: raise the hard limit (ulimit -Hn) before the first "
                          f"share, or run fewer processes at once\n".encode())
                conn.close()
            except OSError:
                paused_until = time.monotonic() + 0.5  # not even that: stop looking a while
            spare = os.open(os.devnull, os.O_RDONLY)
            return
        pid, uid, _ = _peer(conn)
        if uid != os.getuid():
            conn.close()
            return
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
        peers[conn] = _Peer(pid)

    def receive(conn, peer, candidates, questions):
        data, closed = _drain(conn)
        for line in peer.lines(data):
            message = parse(line)
            if message is None:
                continue                   # not a message: skipped, the client stays
            op, name, n = message
            if op == "GROUP":              # the client's process group, said first
                peer.group = n
            elif op == "HOLD":
                if name not in peer.holds and len(peer.holds) >= MAX_NAMES:
                    continue
                peer.holds[name] = n
                known.add(name)
                groups.setdefault(name, set()).add(peer.group)
                in_flight.pop(name, None)  # held again: it arrived
                if n is not None:
                    counted.add(name)
            elif op == "DROP":
                if peer.holds.pop(name, False) is not False:
                    candidates.add(name)
            elif op == "UNLINKED":
                if not os.path.exists("/dev/shm" + name):
                    forget(name)           # believed only when it is true: the name is gone
            elif op == "FATE":             # a question (see fate()): answered after the round
                questions.append((conn, name))
        if closed:
            # The client exited, normally or killed: what it held may be nobody's now, and
            # the counts it held in headers will never be given back.
            sel.unregister(conn)
            for name, n in peers.pop(conn).holds.items():
                if n:                      # counts of ours it will never give back
                    dead[name] = dead.get(name, 0) + n
                candidates.add(name)
            conn.close()

    adopt()
    while True:
        events = sel.select(timeout=0.1)
        # Nobody waits for our answers, so there is no hurry: gather what arrives in the next
        # millisecond into one round. On a busy machine that is one wake-up instead of one per
        # message (each costs the sender a context switch), for 1 ms more cleanup latency. Not
        # much longer: each small message takes ~1 KiB of its sender's socket buffer (212 KiB),
        # so a client sending more than ~200 messages per pause would block until we read.
        time.sleep(BATCH_SECONDS)
        events = sel.select(timeout=0) or events
        candidates = set()  # names that may have lost their last holder in this round
        questions = []
        now = time.monotonic()
        for key, _ in events:
            if key.fileobj is listener:
                if now >= paused_until:
                    accept()
            elif key.fileobj in peers:
                receive(key.fileobj, peers[key.fileobj], candidates, questions)
        if paused_until > now:
            time.sleep(0.01)
        # Decide only after reading every socket that was readable: a message that *caused*
        # another (the sender's HOLD before the receiver's DROP) was written earlier, so it is
        # in this round too, whichever socket we happened to read first.
        for name in candidates:
            if name in known and not held(name):
                decide(name)
        if questions:
            answers = judge_all([name for _, name in questions])
            for (conn, _), answer in zip(questions, answers):
                try:
                    conn.send(answer.encode())
                except OSError:
                    pass
        now = time.monotonic()
        if (in_flight or adopted) and now - last_check >= CHECK_SECONDS:
            last_check = now
            check_adopted()
            check_in_flight(now)
        if peers or in_flight or adopted:
            idle_since = now
        elif now - idle_since > IDLE_SECONDS:
            for name in list(known):
                unlink(name)
            path = listener.getsockname()      # (we still hold the lock: both are ours to remove)
            os.unlink(path)
            os.unlink(_lock_path(path))
            return


def roads(header):
    """What a file_system header says of its handles' roads: (the queue pipes' inodes, a set;
    whether some road is unknown — not a queue pipe, or more roads than slots)."""
    _, claimed, *slots = _HEADER.unpack_from(header, 0)
    return {s for s in slots if s > 0}, claimed > SLOTS or UNKNOWN_ROAD in slots


def _header(name):
    """The 64 header bytes of a file_system segment, read without mapping it; None if gone."""
    import _posixshmem
    try:
        fd = _posixshmem.shm_open(name, os.O_RDONLY, 0)
    except OSError:
        return None
    try:
        data = os.pread(fd, _HEADER.size, 0)
    finally:
        os.close(fd)
    return data if len(data) == _HEADER.size else None


# -- what /proc says: who can still read a pipe, which process groups are alive -------------------

def _pids(but_me=True):
    """Every process's pid (but this one's, unless `but_me` is False: the daemon holds nothing)."""
    me = os.getpid() if but_me else None
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]


def pipes_read(inodes, pids=None):
    """The pipes among `inodes` that a live process has open for reading, as {inode: [pid]}
    (empty lists never: a pipe nobody reads is left out). Only our own user's processes can be
    looked at, and only they can have our queues."""
    found = {}
    if not inodes:
        return found
    wanted = {f"pipe:[{ino}]": ino for ino in inodes}
    for pid in pids if pids is not None else _pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue                       # gone, or not ours
        for fd in fds:
            try:
                ino = wanted.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
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


def _stat(pid):
    """(state, process group) of process `pid` from /proc/PID/stat; (None, None) if it is gone.
    (After the name in parentheses: state, parent pid, process group, session, ...)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None, None


def groups_alive(wanted):
    """Those of the process groups `wanted` that some live (not zombie) process is in."""
    alive = set()
    if not wanted:
        return alive
    for pid in _pids():
        state, group = _stat(pid)
        if group in wanted and state != "Z":
            alive.add(group)
    return alive


def fate(name):
    """What will become of the file_system segment `name`, as ``(kind, words)``, for pictures
    and the learner. The running manager is asked (it alone knows which counts belong to dead
    holders); without one, or for a name it was never told of, what /proc and the header show.
    (``FATE name``: the one message the manager answers.)

    kind: "gone", "held", "in flight" (a live process can still receive a handle to it),
    "unreachable" (nobody can: the manager removes it), "leaked", "maybe in flight", "not
    yours" (another user's: we cannot read it)."""
    return fates([name])[name]


def fates(names):
    """fate() of each of `names`, as {name: (kind, words)}: one connection to the manager for
    all of them, and /proc read once (``mpviz shm`` asks for every name in /dev/shm)."""
    result, headers = {}, {}
    for name in names:
        header = _header(name)
        if header is not None:
            headers[name] = header
            continue
        try:
            owner = os.stat("/dev/shm" + name).st_uid
        except OSError:
            result[name] = "gone", "not in /dev/shm"
            continue
        result[name] = "not yours", (f"belongs to uid {owner}, not to you (uid {os.getuid()}): "
                                     f"only its owner can map it or say what will become of it")
    answers = _ask([f"FATE {name}\n" for name in headers])
    unknown = []
    for name, answer in zip(headers, answers or [None] * len(headers)):
        if answer is None or answer[0] == "unknown":
            unknown.append(name)
            continue
        kind, left, pids = answer
        if kind == "held":
            result[name] = "held", f"mapped by pid {pids}"
        elif kind == "queue":
            result[name] = "in flight", (f"in flight in a queue: {left} handle(s) not received "
                                         f"yet, and pid {pids} can still get them")
        elif kind == "group":
            result[name] = "in flight", (f"in flight by a road mpviz cannot see ({left} "
                                         f"handle(s)): kept while its sender's program (process "
                                         f"group) lives")
        else:
            result[name] = "unreachable", ("no live process maps it or can ever receive a "
                                           "handle to it (its queue is gone): the shm manager "
                                           "removes it")
    if unknown:
        holders = mappers(unknown, _pids(but_me=False))
        pipes = set().union(*(roads(headers[name])[0] for name in unknown))
        readers = pipes_read(pipes, _pids(but_me=False))
        for name in unknown:
            result[name] = _fate_from_proc(headers[name], holders[name], readers)
    return result


def _fate_from_proc(header, holders, readers):
    """fate() without the manager: it cannot tell a dead holder's count from a handle's."""
    if holders:
        return "held", f"mapped by pid {', '.join(map(str, holders[:4]))}"
    pipes, unknown = roads(header)
    pids = sorted({p for ino in pipes for p in readers.get(ino, ())})
    if pids:
        return "maybe in flight", (f"no live process maps it; pid {', '.join(map(str, pids[:4]))} "
                                   f"can still read a queue its handles went through, so one "
                                   f"may still arrive (no shm manager to ask)")
    if unknown:
        return "maybe in flight", ("no live process maps it; a handle went by a road mpviz "
                                   "cannot see, and may still arrive (no shm manager to ask)")
    return "leaked", ("no live process maps it, and none can receive a handle to it: left in "
                      "/dev/shm (no shm manager to remove it)")


_KINDS = ("held", "queue", "group", "unreachable", "unknown")


def _ask(lines, chunk=100):
    """Ask the running manager `lines` (questions), `chunk` at a time on one connection; their
    answers, each split in words, or None (none runs, or it refused us)."""
    if not lines:
        return []
    try:
        sock = _connect(address())
    except (OSError, ValueError, ManagerUnsafe):
        return None
    if sock is None:
        return None
    answers = []
    try:
        sock.settimeout(5)
        buffer = b""
        for start in range(0, len(lines), chunk):
            asked = lines[start:start + chunk]
            sock.sendall("".join(asked).encode())
            while buffer.count(b"\n") < len(asked):
                data = sock.recv(65536)
                if not data:
                    return None
                buffer += data
            *got, buffer = buffer.split(b"\n")
            answers += [line.decode("ascii", "replace").split() for line in got]
    except OSError:
        return None
    finally:
        sock.close()
    if any(len(a) != 3 or a[0] not in _KINDS for a in answers):
        return None                        # a refusal, or not our manager's words
    return answers


def _drain(conn, most=READ_PER_ROUND):
    """Read what the client has sent so far, at most `most` bytes (the rest waits for the next
    round); also say whether it has closed."""
    chunks, size = [], 0
    while size < most:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return b"".join(chunks), False
        except OSError:
            return b"".join(chunks), True
        if not data:
            return b"".join(chunks), True
        chunks.append(data)
        size += len(data)
    return b"".join(chunks), False


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _daemonize()
    serve()
