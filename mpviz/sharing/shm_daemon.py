"""The shm manager's daemon: one process per user that unlinks the segments nobody alive holds.

Started by the first client (``shm_manager.py --serve``, see :mod:`mpviz.sharing.shm_manager`
for why and for the client's side), it runs one loop::

    clients' sockets ──lines──▶ _Manager.round(): every select() (+1 ms to gather more)
      HOLD name n / DROP name     per client (_Peer): what it holds and its count in the header
      LETGO name                  (a count about to be given back: see left())
      GROUP g / UNLINKED / FATE   a client that closes (exited, or SIGKILLed) holds nothing
                                  ▼
    a name nobody alive holds ──▶ decide(): no handle in flight (left()) → unlink it
                                  handles in flight → check_in_flight() every CHECK_SECONDS:
                                  look_at_proc() reads /proc, judge() the header's channels

* Exactly one per address: a lock file (flock, freed by the kernel even after SIGKILL) says
  who serves; the one holding it removes a socket file a killed manager left (:func:`_listen`).
* A killed manager's names are *adopted* by the next one (``_Manager.adopt``).
* Idle for ``IDLE_SECONDS`` (no client, nothing in flight): it unlinks what it knows, exits.

Standard library only, imported beside shm_manager.py (not through the mpviz package) so that
it starts fast; adapted from torch's ``libshm`` manager, which cleans up only when every client
is gone.
"""
import errno
import fcntl
import os
import re
import resource
import selectors
import socket
import time

if __package__:          # imported as mpviz.sharing.shm_daemon (to read it, or in a test)
    from .shm_manager import MAX_LINE, _header, _peer, _proc, address, channels, header_count
else:                    # in the daemon, started as shm_manager.py --serve (see its end)
    from shm_manager import MAX_LINE, _header, _peer, _proc, address, channels, header_count

IDLE_SECONDS = 1.0
CHECK_SECONDS = 1.0     # how often names in flight are looked at again (a scan of /proc)
BATCH_SECONDS = 0.001   # see _Manager.round(): longer, and a busy client fills its socket
                        # buffer and waits
READ_PER_ROUND = 1 << 20  # bytes read from one client per round: a flood cannot grow us
MAX_NAMES = 1 << 16     # names one client may hold (a process cannot map more: vm.max_map_count)
FD_RESERVE = 24         # descriptors no client gets: our own ~8 (stdio, listener, lock, spare,
                        # selector) and room to read /proc and headers. Full of clients without
                        # it, listdir('/proc') failed (EMFILE) and the manager died.


def main():
    """Become a daemon, then serve (or exit at once if another manager serves this address).
    The starter reads our stderr to its end: it ends when we listen (``_quiet`` in serve), or
    when we die of an error, whose traceback it then has to say why."""
    _daemonize()
    serve()


def _daemonize():
    """Double fork and ``setsid()``: no terminal, no parent that waits for us."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)


def _quiet():
    """stdin, stdout, stderr on /dev/null: the starter's read of our stderr ends."""
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
    A manager removes its lock file when it exits (``_Manager.close``), so the file we locked
    must still be the one at `path`: else we locked one just removed, and try again."""
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


# -- what /proc says (through _proc.py): which processes, which process groups are alive ---------

def _pids():
    """Every process's pid but ours (the daemon holds nothing)."""
    me = os.getpid()
    return [pid for pid in _proc.pids() if pid != me]


def process_group(pid):
    """Process `pid`'s process group (a zombie's too); None if it is gone."""
    st = _proc.stat(pid)
    return None if st is None else st.group


def groups_alive(wanted):
    """Those of the process groups `wanted` that some live (not zombie) process is in."""
    alive = set()
    if not wanted:
        return alive
    for pid in _pids():
        st = _proc.stat(pid)
        if _proc.alive(st) and st.group in wanted:
            alive.add(st.group)
    return alive


def _raise_fd_limit():
    """Raise our soft limit on descriptors to the hard one: each client is one descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass


class _Peer:
    """One client: its pid and process group (a handle's channel may be unknown), what it holds
    ({name: how many counts in its header are the client's (0: it maps it, counted out), None:
    a name with no count}), and the part of a line not yet ended."""

    def __init__(self, pid):
        self.pid, self.group = pid, process_group(pid)
        self.holds = {}
        self.letting_go = set()    # names it said LETGO of, and has not said the new number of
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
    [n]``, ``LETGO name``, ``DROP name``, ``UNLINKED name``, ``FATE name``. n is None or
    0..2**31."""
    try:
        words = line.decode("ascii").split(" ")
    except UnicodeDecodeError:
        return None
    if len(words) == 2 and words[0] == "GROUP" and words[1].isdigit() and len(words[1]) < 11:
        return "GROUP", None, int(words[1])
    if len(words) == 3 and words[0] == "HOLD" and words[2].isdigit() and len(words[2]) < 10:
        op, name, n = words[0], words[1], int(words[2])
    elif len(words) == 2 and words[0] in ("HOLD", "LETGO", "DROP", "UNLINKED", "FATE"):
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


def serve():
    """Listen (unless another manager serves this address), then serve until idle."""
    listener = _listen()           # (an error here reaches the starter: see main())
    _quiet()
    if listener is None:
        return  # another manager is already serving this user
    _Manager(listener).run()


class _Manager:
    """What the daemon knows, and one method per thing it does: ``run`` loops over rounds;
    each round ``accept``s clients and ``receive``s their lines, then ``decide``s the names
    that lost their last holder and answers ``FATE`` questions (``judge_all``); every
    CHECK_SECONDS it looks again at adopted names and names in flight."""

    def __init__(self, listener):
        self.listener = listener
        _raise_fd_limit()
        self.soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.most_clients = self.soft_limit - FD_RESERVE
        self.spare = os.open(os.devnull, os.O_RDONLY)  # given up to accept, refuse, one client
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.peers = {}       # client socket -> _Peer
        self.counted = set()  # names whose header counts holders, handles in flight (file_system)
        self.dead = {}        # name -> counts in its header of clients that died holding it
        self.doubt = {}       # name -> how many of those died between LETGO and the new number
        self.confirmed = {}   # name -> releases its clients said the new number of (LETGO ...)
        self.base = {}        # name -> releases already in its header when we adopted it
        self.groups = {}      # name -> the process groups of the clients that ever held it
        self.known = set()    # every name ever mentioned, for the final sweep
        self.in_flight = {}   # name -> since when nobody holds it, with handles in flight
        self.adopted = {}     # name -> pids that mapped it when we found it (a killed
                              # manager's names)
        self.idle_since = self.last_check = time.monotonic()
        self.paused_until = 0.0

    def run(self):
        """Adopt what a killed manager left, then serve rounds until idle for IDLE_SECONDS."""
        self.adopt()
        while self.round():
            pass

    def round(self):
        """Read every client that wrote, decide, answer, check; False when it is time to go."""
        events = self.sel.select(timeout=0.1)
        # Nobody waits for our answers, so there is no hurry: gather what arrives in the next
        # millisecond into one round. On a busy machine that is one wake-up instead of one per
        # message (each costs the sender a context switch), for 1 ms more cleanup latency. Not
        # much longer: each small message takes ~1 KiB of its sender's socket buffer (212 KiB),
        # so a client sending more than ~200 messages per pause would block until we read.
        time.sleep(BATCH_SECONDS)
        events = self.sel.select(timeout=0) or events
        candidates = set()  # names that may have lost their last holder in this round
        questions = []
        now = time.monotonic()
        for key, _ in events:
            if key.fileobj is self.listener:
                if now >= self.paused_until:
                    self.accept()
            elif key.fileobj in self.peers:
                self.receive(key.fileobj, self.peers[key.fileobj], candidates, questions)
        if self.paused_until > now:
            time.sleep(0.01)
        # Decide only after reading every socket that was readable: a message that *caused*
        # another (the sender's HOLD before the receiver's DROP) was written earlier, so it is
        # in this round too, whichever socket we happened to read first.
        for name in candidates:
            if name in self.known and not self.held(name):
                self.decide(name)
        if questions:
            self.answer(questions)
        now = time.monotonic()
        if (self.in_flight or self.adopted) and now - self.last_check >= CHECK_SECONDS:
            self.last_check = now
            self.check_adopted()
            self.check_in_flight(now)
        if self.peers or self.in_flight or self.adopted:
            self.idle_since = now
        elif now - self.idle_since > IDLE_SECONDS:
            self.close()
            return False
        return True

    def close(self):
        """Idle: unlink every name we know, remove our socket and lock files."""
        for name in list(self.known):
            self.unlink(name)
        path = self.listener.getsockname()      # (we still hold the lock: both are ours to remove)
        os.unlink(path)
        os.unlink(_lock_path(path))

    def unlink(self, name):
        """Remove `name` from /dev/shm, and from everything we know."""
        try:
            import _posixshmem
            _posixshmem.shm_unlink(name)
        except OSError:
            pass
        self.forget(name)

    def forget(self, name):
        """Drop `name` from everything we know (it is gone from /dev/shm)."""
        self.known.discard(name)
        self.counted.discard(name)
        self.dead.pop(name, None)
        self.doubt.pop(name, None)
        self.confirmed.pop(name, None)
        self.base.pop(name, None)
        self.groups.pop(name, None)
        self.in_flight.pop(name, None)
        self.adopted.pop(name, None)

    def held(self, name):
        """Whether a client, or a live process that mapped an adopted name, holds `name`."""
        return name in self.adopted or any(name in p.holds for p in self.peers.values())

    def decide(self, name):
        """For a name nobody alive holds: unlink it, or keep it in flight."""
        if name not in self.counted:
            return self.unlink(name)
        header = _header(name)
        if header is None or self.left(name, header) <= 0:
            return self.unlink(name)       # no handle in flight: nobody can come for it
        self.in_flight.setdefault(name, time.monotonic())

    def left(self, name, header):
        """Handles of `name` in flight: its count less the counts of clients that died holding
        it. A client that died between ``LETGO`` and its new number may or may not have given
        its count back; the releases in the header settle it: those nobody said the new number
        of were given back by such clients (at most one each). Where a release is not said at
        all (a process with the manager switched off), the doubt falls on the keeping side."""
        count, releases = header_count(header)
        doubt = self.doubt.get(name, 0)
        unsaid = releases - self.confirmed.get(name, 0) - self.base.get(name, 0)
        return count - self.dead.get(name, 0) + min(doubt, max(unsaid, 0))

    def adopt(self):
        """A manager killed before us left these names: each is held for the live processes
        that map it. One that nobody maps is judged at the first check (CHECK_SECONDS from now),
        not at once: its creator may be between creating and mapping it."""
        found = _ours("mpviz_" + os.environ.get("MPVIZ_SHM_TAG", ""))
        holders = _proc.mappers(list(found), _pids())
        for name, has_count in found.items():
            self.known.add(name)
            if has_count:
                self.counted.add(name)
                header = _header(name)   # (releases said to the manager before us: not ours)
                self.base[name] = header_count(header)[1] if header else 0
            self.groups[name] = {g for g in (process_group(p) for p in holders[name])
                                 if g is not None}
            self.adopted[name] = set(holders[name])

    def check_adopted(self):
        """Adopted names that no live process maps any more are nobody's now (unless a
        client said it holds them since): judged as if their last holder had just gone.
        (Their holders' counts in the header are not known: they count as in flight, and
        go with their holders' process groups, or when no live process can read their
        queue.)"""
        alive = _proc.mappers(list(self.adopted), _pids())
        for name in list(self.adopted):
            self.adopted[name] = set(alive[name])
            if not self.adopted[name]:
                del self.adopted[name]
                if not self.held(name):
                    self.decide(name)

    def check_in_flight(self, now):
        """Names in flight for a while: can a live process still receive one of their handles?
        Every ``CHECK_SECONDS`` each is looked at again (``judge``); one that nobody
        can ever receive is unlinked. So a tensor put on a queue arrives however long after its
        sender died, while anyone can still ``get`` from that queue (a forked child that
        inherited the pipe counts too)."""
        waiting = {}
        for name, since in list(self.in_flight.items()):
            if self.held(name):
                del self.in_flight[name]   # it arrived: its receiver holds it now
            elif now - since >= CHECK_SECONDS:
                header = _header(name)
                if header is None or self.left(name, header) <= 0:
                    self.unlink(name)      # its last handle arrived, and was let go
                else:
                    waiting[name] = header
        readers, lives = self.look_at_proc(waiting)
        for name, header in waiting.items():
            if self.judge(name, header, readers, lives)[0] == "unreachable":
                self.unlink(name)          # no live process can ever receive a handle to it

    def look_at_proc(self, headers):
        """For `headers` ({name: header}): which of their queue pipes a live process reads,
        and which of their holders' process groups live (/proc read once for all)."""
        if not headers:
            return {}, set()
        pipes = set().union(*(channels(header)[0] for header in headers.values()))
        return (_proc.pipes_read(pipes, _pids()),
                groups_alive({g for name in headers for g in self.groups.get(name, ())}))

    def judge(self, name, header, readers, lives):
        """For a name nobody alive holds: (kind, handles left in flight, pids that can read its
        queue), kind as decided from the channel each sender wrote in the header (the queue pipe's
        inode; -1 for a ``Pipe``, ``SimpleQueue``, ``Pool``)::

            the pipe is named, and a live process has its reading end open   -> "queue": kept
              (/proc/PID/fd/N -> "pipe:[inode]", /proc/PID/fdinfo/N)
            no channel named, and a process of a holder's process group lives   -> "group": kept
            otherwise: no live process can ever receive a handle to it       -> "unreachable"
        """
        left = self.left(name, header)
        pipes, unknown = channels(header)
        pids = sorted({p for ino in pipes for p in readers.get(ino, ())})
        if left > 0 and pids:
            return "queue", left, pids
        if left > 0 and (unknown or not pipes) and self.groups.get(name, set()) & lives:
            return "group", left, []
        return "unreachable", left, []

    def answer(self, questions):
        """Answer each ``FATE`` question [(conn, name)] of this round, a line each."""
        answers = self.judge_all([name for _, name in questions])
        for (conn, _), answer in zip(questions, answers):
            try:
                conn.send(answer.encode())
            except OSError:
                pass

    def judge_all(self, names):
        """Our view of each of `names`, a line each (``FATE``'s answer): what decide() and
        check_in_flight() go by."""
        headers = {name: _header(name) for name in names}
        readers, lives = self.look_at_proc({n: h for n, h in headers.items() if h is not None})
        answers = []
        for name in names:
            pids = ([p.pid for p in self.peers.values() if name in p.holds]
                    + sorted(self.adopted.get(name, ())))
            if pids:
                kind, left = "held", 0
            elif name not in self.known or headers[name] is None or name not in self.counted:
                kind, left = "unknown", 0
            else:
                kind, left, pids = self.judge(name, headers[name], readers, lives)
            answers.append(f"{kind} {left} {','.join(map(str, pids)) or '-'}\n")
        return answers

    def accept(self):
        """A new client, if it is of our user and we have a descriptor for it beyond
        FD_RESERVE. Else it is told why and closed (else it would wait). Out of descriptors all
        the same (the whole system is): the spare one is given up to take the client and do so
        (else we would spin on a listener that stays readable)."""
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                return
            os.close(self.spare)
            try:
                self.refuse(self.listener.accept()[0])
            except OSError:
                self.paused_until = time.monotonic() + 0.5  # not even that: stop looking a while
            self.spare = os.open(os.devnull, os.O_RDONLY)
            return
        pid, uid, _ = _peer(conn)
        if uid != os.getuid():
            conn.close()
            return
        if len(self.peers) >= self.most_clients:
            try:
                self.refuse(conn)
            except OSError:
                conn.close()                       # (it left already)
            return
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ)
        self.peers[conn] = _Peer(pid)

    def refuse(self, conn):
        """Tell a client we have no descriptor for it why, and close it."""
        conn.setblocking(False)
        conn.send(f"REFUSED the shm manager (pid {os.getpid()}) serves {len(self.peers)} "
                  f"processes and has no descriptor left for more (limit {self.soft_limit}, of "
                  f"which it keeps {FD_RESERVE} for its own reads): this process shares "
                  f"without it, so its segments stay in /dev/shm if it is killed. Fix: raise "
                  f"the hard limit (ulimit -Hn) before the first share, or run fewer "
                  f"processes at once\n".encode())
        conn.close()

    def receive(self, conn, peer, candidates, questions):
        """Read a client's lines and act on each; a client that closed holds nothing now."""
        data, closed = _drain(conn)
        for line in peer.lines(data):
            message = parse(line)
            if message is None:
                continue                   # not a message: skipped, the client stays
            op, name, n = message
            if op == "GROUP":              # the client's process group, said first
                peer.group = n
            elif op == "LETGO":
                if name in peer.holds:
                    peer.letting_go.add(name)
            elif op == "HOLD":
                if name not in peer.holds and len(peer.holds) >= MAX_NAMES:
                    continue
                self.said(peer, name)
                peer.holds[name] = n
                self.known.add(name)
                self.groups.setdefault(name, set()).add(peer.group)
                self.in_flight.pop(name, None)  # held again: it arrived
                if n is not None:
                    self.counted.add(name)
            elif op == "DROP":
                self.said(peer, name)
                if peer.holds.pop(name, False) is not False:
                    candidates.add(name)
            elif op == "UNLINKED":
                if not os.path.exists("/dev/shm" + name):
                    self.forget(name)      # believed only when it is true: the name is gone
            elif op == "FATE":             # a question (see fate()): answered after the round
                questions.append((conn, name))
        if closed:
            self.drop_peer(conn, candidates)

    def said(self, peer, name):
        """`peer` said its new number of `name`: if after a LETGO, one release is accounted for."""
        if name in peer.letting_go:
            peer.letting_go.discard(name)
            self.confirmed[name] = self.confirmed.get(name, 0) + 1

    def drop_peer(self, conn, candidates):
        """The client exited, normally or killed: what it held may be nobody's now, and the
        counts it held in headers will never be given back (one it was giving back when it
        died, between LETGO and the new number, is in doubt: see left)."""
        self.sel.unregister(conn)
        peer = self.peers.pop(conn)
        for name, n in peer.holds.items():
            if n:                          # counts of ours it will never give back
                self.dead[name] = self.dead.get(name, 0) + n
                if name in peer.letting_go:
                    self.doubt[name] = self.doubt.get(name, 0) + 1
            candidates.add(name)
        conn.close()


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
