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
  if the name is gone, fd limits raised or refused with a reason.
* **Handles in flight are read from the segment's header** (:func:`fate`); a manager that was
  killed is followed by one that *adopts* the names it finds in /dev/shm.
* Idle for a second: it unlinks what it knows and exits. Off: ``MPVIZ_SHM_MANAGER=0``.

Adapted from torch's ``libshm``. This file is the client, and what both sides read of a
segment's header (and of /proc, through ``mpviz/_proc.py``); the daemon is :mod:`mpviz.sharing.shm_daemon`, started as this file
run with ``--serve``. Standard library only, so that the daemon starts fast.
"""
import hashlib
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings

if __package__:          # imported as mpviz.sharing.shm_manager
    from .. import _proc
else:                    # the daemon: this file run alone (see its end), no package; _proc.py
    import importlib.util    # imports nothing of mpviz either, so load it by its path (not by
                             # putting mpviz/ on sys.path: its multiprocessing/ would hide the
                             # stdlib's; the path is this file's own folder's parent)
    _spec = importlib.util.spec_from_file_location("_proc", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_proc.py"))
    _proc = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_proc)

MAX_LINE = 1024         # bytes: a message is a word and a name of at most 255 bytes
REFUSED_SECONDS = 10.0  # a refused client tries again after this long
_ENV = "MPVIZ_SHM_MANAGER"
_ENV_DIR = "MPVIZ_SHM_MANAGER_DIR"

# The header of a file_system segment. Its senders write it (file_system.py: note_channel), the
# manager reads it (fate, and the daemon); this file uses only the standard library, so the
# layout is defined, and drawn, here:
#
#   /dev/shm/mpviz_3f9c…  (mode 0600)
#   +----------------+----------------+-----------------------------+-----------+
#   | refcount (8 B) | channels (8 B) | 6 channel slots (6 x 8 B)   | the bytes |
#   +----------------+----------------+-----------------------------+-----------+
#     how many holders and in-flight handles exist, in all processes (segment.py counts)
#                      how many channels its handles took; which ones (a queue pipe's
#                      inode, or -1: a channel mpviz cannot name)
#
# The count's 8 bytes hold two numbers, changed together by one atomic add: the count (the low
# 32 bits, signed) and how many holders have given theirs back (the high 32: "releases"). A
# holder gives back with one add of RELEASE (count -1, releases +1); a handle's count that a
# receiver already mapping the memory drops is a plain -1. Why: a holder killed between its
# "LETGO" line and that add leaves the manager in doubt -- did it give back? -- and the number
# of releases settles it (shm_daemon._Manager.left).
_HEADER = struct.Struct("=qq6q")    # count and releases, channels claimed, 6 channel slots
CHANNELS_AT, SLOTS_AT, SLOTS = 8, 16, 6
UNKNOWN_CHANNEL = -1                # a slot's value for a channel mpviz cannot name
RELEASE = (1 << 32) - 1             # one add: the count -1, the releases +1


def split_count(word):
    """(count, releases) of the header's first 8 bytes read as a signed integer."""
    count = ((word + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    return count, ((word - count) >> 32) & 0xFFFFFFFF


def header_count(header):
    """(count, releases) of a header read by _header()."""
    return split_count(_HEADER.unpack_from(header, 0)[0])

PROTOCOL = 6  # in the address: a manager that speaks older lines never serves newer clients


class ManagerUnsafe(RuntimeError):
    """Raised when the shm manager's private directory, or the process listening at its socket,
    is not this user's alone: another user could read every segment name this program shares,
    or make it wait. The message names what was found and how to fix it."""


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
    except OSError as exc:
        if not os.environ.get(_ENV_DIR):
            raise                          # /tmp itself: the next message tries again
        raise ValueError(f"{_ENV_DIR}={os.environ[_ENV_DIR]!r}: the shm manager's directory "
                         f"{path} cannot be made there ({exc.strerror}), so no manager could "
                         f"remove the segments of a killed process. Fix: an existing directory "
                         f"you can write, or unset {_ENV_DIR} (/tmp)") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)!r})"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o077:
        raise ManagerUnsafe(
            f"the shm manager's private directory {path} is yours but open to other users "
            f"(mode {stat.S_IMODE(st.st_mode):o}, not 700): mpviz keeps the manager's socket "
            f"where only you can reach it. Fix: chmod 700 {path}")
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
    tensor. A count goes up after the manager hears of it; a count given back is said twice:
    ``LETGO name`` before, and the new number (``HOLD name 0`` or ``DROP``) after. Killed in
    between, the holder leaves the manager in doubt, which the header's count of releases
    settles. After a reconnect (the manager was killed) it says again everything it holds.
    """

    def __init__(self):
        self.pid = os.getpid()
        self.fd = None  # a raw descriptor: it lives as long as the process, and closes with it
        self.lock = threading.Lock()
        self.mapped = {}    # file_system name -> [mappings counted in its header, not counted]
        self.plain = set()  # names with no count in them (simulated CUDA memory) we hold
        self.refused_until = 0.0   # the manager refused us (out of descriptors): not before then
        self.unsafe = False        # its directory or listener is another user's: raised once
        self.failed = False        # no manager could be started: said once, not tried again

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

    def letting_go(self, name):
        """Our count of `name` is about to be given back (``change`` says the new number after)."""
        with self.lock:
            if name in self.mapped:
                self._write(f"LETGO {name}\n")

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

    def _write(self, line, again=True):
        if self.fd is None:
            if time.monotonic() < self.refused_until:
                return
            if self.unsafe or self.failed:
                return      # said once: this process shares without the manager
            try:
                self.fd = _connect_or_start().detach()
            except OSError as exc:
                # Not tried at every message: a start that fails can take seconds each time.
                self.failed = True
                warnings.warn(f"the mpviz shm manager could not be started ({exc}): this "
                              f"process (pid {os.getpid()}) shares without it, so if it is "
                              f"killed its file_system segments stay in /dev/shm (python -m "
                              f"mpviz shm lists them). Fix: rm -r {runtime_directory()} (the "
                              f"manager's directory: the next start makes it afresh), or "
                              f"{_ENV}=0 to share without it", RuntimeWarning, stacklevel=3)
                return
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
            self.fd = None  # the manager is gone
            if reason:
                self.refused_until = time.monotonic() + REFUSED_SECONDS
                warnings.warn(f"the mpviz shm manager refused this process (pid {os.getpid()}): "
                              f"{reason}", RuntimeWarning, stacklevel=2)
            elif again:
                # It was killed: start the next one now and tell it all we hold. Waiting for
                # our next message could mean never, and then our names outlive us if we die.
                self._write(line, again=False)


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
    def letting_go(self, name): pass
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
        _forget_client()               # after fork: the parent's isn't ours
    if _client is None:
        if not _enabled:
            return _OFF
        _client = _Client()
    return _client


def _forget_client():
    """In a forked child: close the parent's connection, once. Not the child's own: another
    at-fork hook (segment.py's, which counts the child in) may have run first and made it, and
    closing it would tell the manager that the child died holding what it holds."""
    global _client
    if _client is None or _client.pid == os.getpid():
        return
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
    # daemon finds the lock taken and exits. Its stderr ends once it listens, or once it died
    # of an error (the traceback): run() returns then (shm_daemon.main).
    started = subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__), "--serve"],
                             env=_daemon_environment(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             close_fds=True, check=False, timeout=10)
    said = started.stderr.decode("utf-8", "replace").strip().splitlines()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not said:   # (the lock's holder may be starting)
        sock = _connect(path)
        if sock is not None:
            return sock
        time.sleep(0.005)
    raise OSError(f"nothing listened at {path} after it was started"
                  + (f" (it said: {said[-1]})" if said else " (in 5 s)"))


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


def channels(header):
    """What a file_system header says of its handles' channels: (the queue pipes' inodes, a set;
    whether some channel is unknown — not a queue pipe, or more channels than slots)."""
    _, claimed, *slots = _HEADER.unpack_from(header, 0)
    return {s for s in slots if s > 0}, claimed > SLOTS or UNKNOWN_CHANNEL in slots


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
    answers = _not_held_by_the_dead(list(headers), answers)
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
            result[name] = "in flight", (f"in flight by a channel mpviz cannot see ({left} "
                                         f"handle(s)): kept while its sender's program (process "
                                         f"group) lives")
        else:
            result[name] = "unreachable", ("no live process maps it or can ever receive a "
                                           "handle to it (its queue is gone): the shm manager "
                                           "removes it")
    if unknown:
        pids = _proc.pids()
        holders = _proc.mappers(unknown, pids)
        pipes = set().union(*(channels(headers[name])[0] for name in unknown))
        readers = _proc.pipes_read(pipes, pids)
        # Why the manager cannot say: none runs, or the one that runs never heard of the name
        # (shared with the manager off; it adopts what it finds only when it starts).
        why = ("no shm manager runs" if answers is None else
               "the running shm manager was never told of it: shared with the manager off")
        for name in unknown:
            result[name] = _fate_from_proc(headers[name], holders[name], readers, why)
    return result


def _not_held_by_the_dead(names, answers, tries=20, pause=0.05):
    """`answers` to FATE `names`, asked again (up to `tries` × `pause` s) where the manager said
    "held" by pids that have all ended: a client that died has closed its connection, but the
    manager may not have read that end yet when our question comes (its next round will), and
    "mapped by pid N" of a dead N is false. (3.14's whole suite saw it once: a child SIGKILLed
    and joined just before the question.)"""
    def stale(answer):
        return answer is not None and answer[0] == "held" and not any(
            _proc.alive(_proc.stat(int(p))) for p in answer[2].split(",") if p.isdigit())
    for _ in range(tries):
        again = [i for i, a in enumerate(answers or ()) if stale(a)]
        if not again:
            break
        time.sleep(pause)
        fresh = _ask([f"FATE {names[i]}\n" for i in again])
        if fresh is None:
            break
        for i, a in zip(again, fresh):
            answers[i] = a
    return answers


def _fate_from_proc(header, holders, readers, why):
    """fate() without the manager (`why`: why it was not asked): it cannot tell a dead
    holder's count from a handle's."""
    if holders:
        return "held", f"mapped by pid {', '.join(map(str, holders[:4]))}"
    pipes, unknown = channels(header)
    pids = sorted({p for ino in pipes for p in readers.get(ino, ())})
    if pids:
        return "maybe in flight", (f"no live process maps it; pid {', '.join(map(str, pids[:4]))} "
                                   f"can still read a queue its handles went through, so one "
                                   f"may still arrive ({why})")
    if unknown:
        return "maybe in flight", ("no live process maps it; a handle went by a channel mpviz "
                                   f"cannot see, and may still arrive ({why})")
    return "leaked", ("no live process maps it, and none can receive a handle to it: left in "
                      f"/dev/shm ({why})")


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


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    # Started by _connect_or_start as `python -I -S shm_manager.py --serve`: no site, no mpviz
    # package (nor numpy) to import; the daemon is the module beside this file.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shm_daemon
    shm_daemon.main()
