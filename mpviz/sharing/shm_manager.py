"""The shm manager: a small daemon that removes ``file_system`` segments nobody alive holds.

Why it exists: a ``file_system`` segment is freed by whoever drops its reference count to 0 (see
:mod:`mpviz.sharing.file_system`). A process killed by SIGKILL drops nothing, so its segments
would stay in /dev/shm, using RAM, until reboot. The manager watches instead::

    process A ──"HOLD /mpviz_1 1"──▶ ┌──────────────┐   A dies (SIGKILL): its socket closes, the
    process B ──"HOLD /mpviz_1 1"──▶ │  shm manager │   manager drops A's holds. A name that no
    process A ──"DROP /mpviz_2"────▶ │ (own session)│   connected process holds, and that no
                                     └──────────────┘   handle in flight names, is unlinked.

* One manager per user, at an abstract Unix socket address; it serves only peers of its own uid
  (``SO_PEERCRED``). The first process that needs it starts it; it double-forks and calls
  ``setsid()`` so it outlives its starter and is nobody's child, and points stdin/stdout/stderr at
  /dev/null so a test runner waiting on those pipes is never held open.
* Every message is a line, sent without waiting for an answer: ``HOLD``/``DROP`` (this process
  maps / no longer maps a name), ``UNLINKED``. A process that dies mid-message loses nothing
  that was already written. Messages go when a process maps or unmaps a segment, not for each
  tensor sent: a tensor that comes back to a process that still maps it costs none. (With the
  shared-memory cache on, a kept mapping that is used again, or let go, says so: two a trip.)
* **Handles in flight are read from the segment, not reported.** A ``file_system`` segment's
  header counts its holders *and* the handles in flight (see :mod:`~mpviz.sharing.file_system`).
  Its holders say how many of those counts are theirs: ``HOLD name 1`` (one mapping, counted),
  ``HOLD name 0`` (we still map it, but counted ourselves out: a mapping the shared-memory cache
  keeps, or one about to be let go). A holder says it *before* it gives a count back, so that
  if it is killed in between the manager errs towards keeping the name, never towards removing
  it early. The manager adds up the counts of processes that died; then, for a name nobody holds::

      handles in flight = the count in the header - the counts of dead holders

  and it unlinks the name only when that is 0. So a handle put by a process that is then
  killed still arrives: its count keeps the name. (This used to be two more messages, one per
  handle put and one per handle taken — a system call and a wake-up of this daemon for every
  tensor that crossed, about a quarter of a round trip on a busy 2-core machine.)
  A plain ``HOLD name`` (no count: a simulated CUDA block) is removed once nobody holds it.
* When no client has been connected for ``IDLE_SECONDS``, it unlinks every name it still knows
  (handles pickled but never received, for instance) and exits.
* It can be switched off (``enable(False)``, or ``MPVIZ_SHM_MANAGER=0`` in the environment, which
  spawned children inherit) to *see* the leak.

Adapted from torch's ``libshm`` (``torch_shm_manager``), which tracks allocations per client and
cleans up when all clients are gone. Different: mpviz also cleans up after each dead client.

This file runs both as a module (the client) and as a script (the daemon), and uses only the
standard library so the daemon starts fast.
"""
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time

IDLE_SECONDS = 1.0
BATCH_SECONDS = 0.001   # see serve(): longer, and a busy client fills its socket buffer and waits
_ENV = "MPVIZ_SHM_MANAGER"


PROTOCOL = 2  # in the address: a manager that speaks older lines never serves newer clients


def address():
    return f"\0mpviz-shm-manager-{os.getuid()}-v{PROTOCOL}"


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
    counted = set() # names whose header counts holders and handles in flight (file_system)
    dead = {}       # name -> counts in its header that belong to clients that died holding it
    known = set()   # every name ever mentioned, for the final sweep
    buffers = {}
    idle_since = time.monotonic()

    def unlink(name):
        try:
            import _posixshmem
            _posixshmem.shm_unlink(name)
        except OSError:
            pass
        known.discard(name)
        counted.discard(name)
        dead.pop(name, None)

    def orphaned(name):
        if any(name in h for h in holds.values()):
            return False                   # someone alive maps it
        if name not in counted:
            return True
        count = _header_count(name)        # live holders: none; so the rest of the count is
        return count is None or count - dead.get(name, 0) <= 0   # dead holders and handles

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
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid != os.getuid():
                    conn.close()
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                holds[conn] = {}
                buffers[conn] = b""
                continue
            conn = key.fileobj
            data, closed = _drain(conn)
            buffers[conn] += data
            *lines, buffers[conn] = buffers[conn].split(b"\n")
            for line in lines:
                op, _, rest = line.decode().partition(" ")
                name, _, n = rest.rpartition(" ")      # "HOLD name N": N of its counts ours
                if not (name and n.isdigit()):
                    name, n = rest, None               # no count: "HOLD name", "DROP name"
                if not name.startswith("/mpviz_"):
                    continue  # only ever touch our own segments
                if op == "HOLD":
                    holds[conn][name] = None if n is None else int(n)
                    known.add(name)
                    if n is not None:
                        counted.add(name)
                elif op == "DROP":
                    holds[conn].pop(name, None)
                    candidates.add(name)
                elif op == "UNLINKED":
                    known.discard(name)
                    counted.discard(name)
                    dead.pop(name, None)
            if closed:
                # The client exited, normally or killed: what it held may be nobody's now, and
                # the counts it held in headers will never be given back.
                sel.unregister(conn)
                for name, n in holds.pop(conn).items():
                    if n:                              # counts of ours it will never give back
                        dead[name] = dead.get(name, 0) + n
                    candidates.add(name)
                buffers.pop(conn, None)
                conn.close()
        # Decide only after reading every socket that was readable: a message that *caused*
        # another (the sender's HOLD before the receiver's DROP) was written earlier, so it is
        # in this round too, whichever socket we happened to read first.
        for name in candidates:
            if name in known and orphaned(name):
                unlink(name)
        if holds:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_SECONDS:
            for name in list(known):
                unlink(name)
            return


def _header_count(name):
    """The count at the start of a file_system segment (holders + handles in flight), read
    without mapping it; None if the name is gone."""
    import _posixshmem
    try:
        fd = _posixshmem.shm_open(name, os.O_RDONLY, 0)
    except OSError:
        return None
    try:
        data = os.pread(fd, 8, 0)
    finally:
        os.close(fd)
    return struct.unpack("=q", data)[0] if len(data) == 8 else None


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
