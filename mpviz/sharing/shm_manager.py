"""The shm manager: a small daemon that removes ``file_system`` segments nobody alive holds.

Why: a ``file_system`` segment is freed by whoever drops its count to 0 (see
:mod:`mpviz.sharing.file_system`). A process killed by SIGKILL drops nothing, so its segments
would stay in /dev/shm, using RAM, until reboot. The manager watches instead::

    process A ──"HOLD /mpviz_1 1"──▶ ┌──────────────┐   A dies (SIGKILL): its socket closes, the
    process B ──"HOLD /mpviz_1 1"──▶ │  shm manager │   manager drops A's holds. A name that no
    process A ──"DROP /mpviz_2"────▶ │ (own session)│   connected process holds, and that no
                                     └──────────────┘   handle in flight names, is unlinked.

* One per user (and ``MPVIZ_SHM_TAG``), at an abstract Unix socket, serving only its own uid
  (``SO_PEERCRED``); started by the first process that needs it, double-forked and ``setsid()``
  so it is nobody's child, its stdin/stdout/stderr on /dev/null. A line per message, unanswered
  (:class:`_Client`), sent when a process maps or unmaps, not per tensor.
* **Handles in flight are read from the segment.** For a name nobody holds: in flight = the
  header's count - the counts of dead holders. 0: unlinked at once. Else, every ``CHECK_SECONDS``,
  can one still arrive? (How it judges: ``check_in_flight``, in :func:`serve`.) :func:`fate` asks
  the manager that story for one name.
* Idle (no client, nothing in flight) for ``IDLE_SECONDS``: it unlinks what it knows and exits.
  Off with ``enable(False)`` or ``MPVIZ_SHM_MANAGER=0`` (children inherit it), to *see* the leak.

Adapted from torch's ``libshm`` (``torch_shm_manager``), which cleans up when all clients are
gone; mpviz also cleans up after each dead client. This file is the client (as a module) and the
daemon (as a script), standard library only so the daemon starts fast.
"""
import hashlib
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time

IDLE_SECONDS = 1.0
CHECK_SECONDS = 1.0     # how often names in flight are looked at again (a scan of /proc)
BATCH_SECONDS = 0.001   # see serve(): longer, and a busy client fills its socket buffer and waits
_ENV = "MPVIZ_SHM_MANAGER"

# The header of a file_system segment, as far as the manager reads it (file_system writes it:
# see the picture there). This file uses only the standard library, so the layout lives here.
_HEADER = struct.Struct("=qq6q")    # count, roads claimed, 6 road slots
ROADS_AT, SLOTS_AT, SLOTS = 8, 16, 6
UNKNOWN_ROAD = -1                   # a slot's value for a road mpviz cannot name

PROTOCOL = 4  # in the address: a manager that speaks older lines never serves newer clients


def address():
    """One manager per user, per ``MPVIZ_SHM_TAG`` (a test run's tag gets its own) and per
    /dev/shm: an abstract socket belongs to the network namespace, not the mount namespace, so
    a container with its own /dev/shm on the host's network would otherwise reach a manager
    that cannot see (nor unlink) its names. The device number of /dev/shm tells them apart."""
    tag = os.environ.get("MPVIZ_SHM_TAG", "")
    tag = "-" + hashlib.sha1(tag.encode()).hexdigest()[:12] if tag else ""
    try:
        dev = f"-d{os.stat('/dev/shm').st_dev:x}"
    except OSError:
        dev = ""
    return f"\0mpviz-shm-manager-{os.getuid()}{tag}{dev}-v{PROTOCOL}"


_enabled = os.environ.get(_ENV, "1") != "0"   # read once: a put asks for every tensor it sends


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
    keeping).
    """

    def __init__(self):
        self.pid = os.getpid()
        self.fd = None  # a raw descriptor: it lives as long as the process, and closes with it
        self.lock = threading.Lock()
        self.mapped = {}    # file_system name -> [mappings counted in its header, not counted]
        self.plain = set()  # names with no count in them (simulated CUDA memory) we hold

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

    def _write(self, line):
        try:
            if self.fd is None:
                self.fd = _connect_or_start().detach()
                # Our process group first: the manager could read it from /proc only while we
                # live, and a sender killed right after its put is gone before it is accepted.
                line = f"GROUP {os.getpgrp()}\n" + line
            data = line.encode()
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None  # the manager is gone; the next message starts a new one


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
    sock = _try_connect()
    if sock is not None:
        return sock
    # Nobody is listening: start the daemon. Two processes racing here is fine: the second
    # daemon finds the address taken and exits.
    subprocess.run([sys.executable, os.path.abspath(__file__), "--serve"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   close_fds=True, check=False, timeout=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sock = _try_connect()
        if sock is not None:
            return sock
        time.sleep(0.005)
    raise OSError("the mpviz shm manager did not start")


def _try_connect():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address())
        return sock
    except OSError:
        sock.close()
        return None


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


def serve():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address())
    except OSError:
        return  # another manager is already serving this user
    listener.listen(128)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    holds = {}      # client socket -> {name: how many counts in its header are the client's
                    #                  (0: it maps it, counted out), None: a name with no count}
    client = {}     # client socket -> (its pid, its process group: a handle's road may be unknown)
    counted = set() # names whose header counts holders and handles in flight (file_system)
    dead = {}       # name -> counts in its header that belong to clients that died holding it
    groups = {}     # name -> the process groups of the clients that ever held it
    known = set()   # every name ever mentioned, for the final sweep
    in_flight = {}  # name -> since when nobody holds it, with handles still in flight
    buffers = {}
    idle_since = last_check = time.monotonic()

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

    def held(name):
        return any(name in h for h in holds.values())

    def decide(name):
        """For a name nobody alive holds: unlink it, or keep it in flight."""
        if name not in counted:
            return unlink(name)
        header = _header(name)
        if header is None or header[0] - dead.get(name, 0) <= 0:
            return unlink(name)            # no handle in flight: nobody can come for it
        in_flight.setdefault(name, time.monotonic())

    def check_in_flight(now):
        """Names in flight for a while: can a live process still receive one of their handles?

        Every ``CHECK_SECONDS``: the sender wrote its road in the header (the queue pipe's
        inode; -1 for a ``Pipe``, ``SimpleQueue``, ``Pool``)::

            the pipe is named, and a live process has its reading end open      -> keep it
              (/proc/PID/fd/N -> "pipe:[inode]", /proc/PID/fdinfo/N)
            no road named, and a process of a holder's process group lives      -> keep it
            otherwise: no live process can ever receive a handle to it          -> unlink it

        So a tensor put on a queue arrives however long after its sender died, while anyone can
        still ``get`` from that queue (a forked child that inherited the pipe counts too)."""
        waiting = {}
        for name, since in list(in_flight.items()):
            if held(name):
                del in_flight[name]        # it arrived: its receiver holds it now
            elif now - since >= CHECK_SECONDS:
                header = _header(name)
                if header is None or header[0] - dead.get(name, 0) <= 0:
                    unlink(name)           # its last handle arrived, and was let go
                else:
                    waiting[name] = roads(header)
        if not waiting:
            return
        readable = pipes_read({ino for pipes, _ in waiting.values() for ino in pipes})
        lives = groups_alive({g for name in waiting for g in groups.get(name, ())})
        for name, (pipes, unknown) in waiting.items():
            if pipes & readable.keys():
                continue                   # a live process can still get it from that queue
            if (unknown or not pipes) and groups.get(name, set()) & lives:
                continue                   # a road we cannot see, and its senders' program lives
            unlink(name)                   # no live process can ever receive a handle to it

    def judge(name):
        """Our view of `name`, as one line: what decide() and check_in_flight() go by."""
        pids = [client[c][0] for c, h in holds.items() if name in h]
        if pids:
            return f"held 0 {','.join(map(str, pids))}\n"
        header = _header(name)
        if name not in known or header is None or name not in counted:
            return "unknown 0 -\n"
        left = header[0] - dead.get(name, 0)
        pipes, unknown = roads(header)
        readers = pipes_read(pipes)
        if left > 0 and readers:
            pids = sorted({p for ps in readers.values() for p in ps})
            return f"queue {left} {','.join(map(str, pids))}\n"
        if left > 0 and (unknown or not pipes) and \
                groups.get(name, set()) & groups_alive(groups.get(name, set())):
            return f"group {left} -\n"
        return f"unreachable {left} -\n"

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
        for key, _ in events:
            if key.fileobj is listener:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                # fd_passing.peer_credentials, written out: the daemon runs as a script and
                # imports only the standard library (see the top of this file)
                pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET,
                                                                  socket.SO_PEERCRED, 12))
                if uid != os.getuid():
                    conn.close()
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                holds[conn] = {}
                client[conn] = pid, _stat(pid)[1]
                buffers[conn] = b""
                continue
            conn = key.fileobj
            data, closed = _drain(conn)
            buffers[conn] += data
            *lines, buffers[conn] = buffers[conn].split(b"\n")
            for line in lines:
                op, _, rest = line.decode().partition(" ")
                if op == "GROUP" and rest.isdigit():   # the client's process group, said first
                    client[conn] = client[conn][0], int(rest)
                    continue
                name, _, n = rest.rpartition(" ")      # "HOLD name N": N of its counts ours
                if not (name and n.isdigit()):
                    name, n = rest, None               # no count: "HOLD name", "DROP name"
                if not name.startswith("/mpviz_"):
                    continue  # only ever touch our own segments
                if op == "HOLD":
                    holds[conn][name] = None if n is None else int(n)
                    known.add(name)
                    groups.setdefault(name, set()).add(client[conn][1])
                    in_flight.pop(name, None)          # held again: it arrived
                    if n is not None:
                        counted.add(name)
                elif op == "DROP":
                    holds[conn].pop(name, None)
                    candidates.add(name)
                elif op == "UNLINKED":
                    forget(name)
                elif op == "FATE":                     # a question (see fate()): answer it
                    try:
                        conn.send(judge(name).encode())
                    except OSError:
                        pass
            if closed:
                # The client exited, normally or killed: what it held may be nobody's now, and
                # the counts it held in headers will never be given back.
                sel.unregister(conn)
                for name, n in holds.pop(conn).items():
                    if n:                              # counts of ours it will never give back
                        dead[name] = dead.get(name, 0) + n
                    candidates.add(name)
                buffers.pop(conn, None)
                client.pop(conn, None)
                conn.close()
        # Decide only after reading every socket that was readable: a message that *caused*
        # another (the sender's HOLD before the receiver's DROP) was written earlier, so it is
        # in this round too, whichever socket we happened to read first.
        for name in candidates:
            if name in known and not held(name):
                decide(name)
        now = time.monotonic()
        if in_flight and now - last_check >= CHECK_SECONDS:
            last_check = now
            check_in_flight(now)
        if holds or in_flight:
            idle_since = now
        elif now - idle_since > IDLE_SECONDS:
            for name in list(known):
                unlink(name)
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
    "unreachable" (nobody can: the manager removes it), "leaked", "maybe in flight"."""
    header = _header(name)
    if header is None:
        return "gone", "not in /dev/shm"
    answer = _ask(f"FATE {name}\n")
    if answer is not None and answer[0] != "unknown":
        kind, left, pids = answer
        if kind == "held":
            return "held", f"mapped by pid {pids}"
        if kind == "queue":
            return "in flight", (f"in flight in a queue: {left} handle(s) not received yet, and "
                                 f"pid {pids} can still get them")
        if kind == "group":
            return "in flight", (f"in flight by a road mpviz cannot see ({left} handle(s)): "
                                 f"kept while its sender's program (process group) lives")
        return "unreachable", ("no live process maps it or can ever receive a handle to it "
                               "(its queue is gone): the shm manager removes it")
    return _fate_from_proc(name, header)


def _fate_from_proc(name, header):
    """fate() without the manager: it cannot tell a dead holder's count from a handle's."""
    short = name.lstrip("/")
    holders = [pid for pid in _pids(but_me=False) if _maps(pid, short)]
    if holders:
        return "held", f"mapped by pid {', '.join(map(str, holders[:4]))}"
    _, claimed, *_ = _HEADER.unpack_from(header, 0)
    pipes, unknown = roads(header)
    readers = pipes_read(pipes, _pids(but_me=False))
    if readers:
        pids = sorted({p for ps in readers.values() for p in ps})
        return "maybe in flight", (f"no live process maps it; pid {', '.join(map(str, pids[:4]))} "
                                   f"can still read a queue its handles went through, so one "
                                   f"may still arrive (no shm manager to ask)")
    if unknown:
        return "maybe in flight", ("no live process maps it; a handle went by a road mpviz "
                                   "cannot see, and may still arrive (no shm manager to ask)")
    return "leaked", ("no live process maps it, and none can receive a handle to it: left in "
                      "/dev/shm (no shm manager to remove it)")


def _ask(line):
    """Ask the running manager one question; its answer split in words, or None (none runs)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(address())
        sock.sendall(line.encode())
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = sock.recv(256)
            if not chunk:
                return None
            answer += chunk
        return answer.decode().split()
    except OSError:
        return None
    finally:
        sock.close()


def _maps(pid, short):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return short in f.read()
    except OSError:
        return False


def _drain(conn):
    """Read everything the client has sent so far; also say whether it has closed."""
    chunks = []
    while True:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return b"".join(chunks), False
        except OSError:
            return b"".join(chunks), True
        if not data:
            return b"".join(chunks), True
        chunks.append(data)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _daemonize()
    serve()
