"""The links between ranks on one machine: Unix sockets that carry small messages and fds.

    rank r listens on  "\\0mpviz-dist-<job>-<r>"   (abstract AF_UNIX, SOCK_SEQPACKET: no file)
    rank r-1 ──connect──► rank r                   first message: hello (tag, rank, job)
                                                   accepted only from this user (SO_PEERCRED)

A message is one SEQPACKET datagram: a tag byte, then a payload; it may carry file descriptors
(``socket.send_fds``), which is how a rank hands its neighbour the memfd that holds its half of
the data (ring.py). The tags::

    S  start     "I entered the collective": its header (op, dtype, shape), maybe a new buffer's fd
    D  done      "my step t is done": the chunk you read next is ready in my buffer
    A  ack       "I finished reading your buffer": you may overwrite it
    P  payload   send/recv: a header and the fd of a memfd holding the tensor
    X  abort     "this collective failed": the reason, passed on around the ring

Nothing here is a file: the sockets' names are abstract, the buffers are memfds, so a rank that
dies leaves nothing behind (the kernel frees both with the last process that holds them).

A rank that waits for a peer that has not connected yet (a recv before the sender's first send)
also watches the peer's process: a pidfd (``os.pidfd_open``) becomes readable when that process
ends, so a recv from a rank that died raises at once instead of after the whole timeout (torch's
gloo sees the same through its TCP connection: "Connection closed by peer").
"""
import os
import secrets
import select
import socket
import time

from .. import _proc
from ..sharing.fd_passing import peer_credentials


class LinkTimeout(Exception):
    """Raised (inside mpviz.distributed) when a wait for a peer's message ran out of time."""

    def __init__(self, peer):
        super().__init__(peer)
        self.peer = peer


class LinkClosed(Exception):
    """Raised (inside mpviz.distributed) when a peer closed its socket: it exited or crashed."""

    def __init__(self, peer):
        super().__init__(peer)
        self.peer = peer


class Aborted(Exception):
    """Raised (inside mpviz.distributed) when a peer sent ``X``: the reason is its text."""


def new_job_token():
    return secrets.token_hex(8)


def _address(job, rank):
    return f"\0mpviz-dist-{job}-{rank}"


class Links:
    """This rank's listening socket, and the connections it made or accepted, by (tag, peer)."""

    def __init__(self, job, rank):
        self.job, self.rank = job, rank
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.listener.bind(_address(job, rank))
        self.listener.listen(64)
        self.accepted = {}       # (tag, peer rank) -> socket, accepted but not yet asked for

    def connect(self, tag, peer, deadline, watch=None):
        """A socket to `peer`'s listener, introduced as (tag, this rank). `watch`: a
        :class:`Watch` of peers' processes (a peer that ended: LinkClosed, not a wait)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        while True:
            try:
                sock.connect(_address(self.job, peer))
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if watch is not None and watch.ended(peer):
                    sock.close()
                    raise LinkClosed(peer) from None
                if time.monotonic() >= deadline:   # its listener exists once it joined the store
                    sock.close()
                    raise LinkTimeout(peer) from None
                time.sleep(0.001)
        _check_peer(sock)
        sock.send(f"{tag} {self.rank} {self.job}".encode())
        return sock

    def accept(self, tag, peer, deadline, watch=None):
        """The socket `peer` connected as (tag, peer), accepting others on the way. `watch`: a
        :class:`Watch`: if `peer`'s process ends first, LinkClosed (it never will connect)."""
        ended = watch.fd(peer) if watch is not None else None
        while (tag, peer) not in self.accepted:
            waits = [self.listener] + ([ended] if ended is not None else [])
            ready, _, _ = select.select(waits, [], [], max(deadline - time.monotonic(), 0))
            if self.listener not in ready:
                if ended is not None and (ended in ready or watch.ended(peer)):
                    raise LinkClosed(peer)
                raise LinkTimeout(peer)
            self.listener.settimeout(0.0001)
            try:
                sock, _ = self.listener.accept()
            except (socket.timeout, BlockingIOError):
                continue
            try:
                _check_peer(sock)
                sock.settimeout(max(deadline - time.monotonic(), 0.0001))
                their_tag, their_rank, their_job = sock.recv(256).decode().split()
            except (OSError, ValueError, PermissionError):
                sock.close()                      # not one of ours: dropped
                continue
            if their_job != self.job:
                sock.close()
                continue
            self.accepted[(their_tag, int(their_rank))] = sock
        sock = self.accepted.pop((tag, peer))
        sock.settimeout(None)
        return sock

    def close(self):
        self.listener.close()
        for sock in self.accepted.values():
            sock.close()
        self.accepted.clear()


class Watch:
    """The processes of the other ranks, by rank: ``{rank: (pid, start time)}`` as each rank
    wrote them to the store when it joined (the start time tells a process from a later one
    given the same pid). ``fd(rank)``: a pidfd that becomes readable when it ends (None where
    pidfds are missing: then only ``ended`` answers); ``ended(rank)``: it has ended (True),
    it runs (False), or nobody can say (None: treated as "runs")."""

    def __init__(self, processes):
        self.processes, self.fds = dict(processes), {}

    def fd(self, rank):
        if rank not in self.fds:
            pid, _ = self.processes.get(rank) or (None, None)
            try:
                self.fds[rank] = os.pidfd_open(pid) if pid is not None else None
            except (AttributeError, OSError):       # (gone already, or no pidfd: Linux < 5.3)
                self.fds[rank] = None
        return self.fds[rank]

    def ended(self, rank):
        """True when rank's process is known to have ended: gone, a zombie, or its pid now
        another process's (a start time that differs); False while it runs; None when that is
        unknown -- no pid in the store, or /proc cannot say (this process is out of
        descriptors, say) while the pid is there: the wait goes on, to its timeout."""
        pid, start = self.processes.get(rank) or (None, None)
        if pid is None:
            return None
        st = _proc.stat(pid)
        if st is not None:
            return not _proc.alive(st) or st.start != start
        try:
            os.kill(pid, 0)                  # signal 0: no signal, only "is there such a pid?"
        except ProcessLookupError:
            return True                      # no process has that pid: it ended
        except PermissionError:              # another user's process has it now: the
            return True                      # rank (this user's: _check_peer) ended
        return None                          # the pid is there: whose, /proc cannot say

    def close(self):
        for fd in self.fds.values():
            if fd is not None:
                os.close(fd)
        self.fds.clear()


def _check_peer(sock):
    """Refuse a socket whose other end is not a process of this user (shared hosts)."""
    pid, uid, _ = peer_credentials(sock)          # SO_PEERCRED, as the fd server checks its peers
    if uid != os.getuid():
        sock.close()
        raise PermissionError(f"a process of uid {uid} (pid {pid}) connected; only this user's may")


def send(sock, tag, payload=b"", fds=()):
    """One message: `tag` (one byte) + `payload`, with `fds` passed along (SCM_RIGHTS)."""
    if fds:
        socket.send_fds(sock, [tag + payload], list(fds))
    else:
        sock.send(tag + payload)


def recv(sock, peer, deadline, maxfds=1):
    """(tag, payload, fds) of the next message from `peer`; LinkTimeout, LinkClosed or Aborted."""
    remaining = deadline - time.monotonic()
    sock.settimeout(max(remaining, 0.0))         # 0: only what is there already
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, maxfds)
    except socket.timeout:
        raise LinkTimeout(peer) from None
    except BlockingIOError:
        raise LinkTimeout(peer) from None
    except (ConnectionResetError, BrokenPipeError):
        raise LinkClosed(peer) from None
    if not data:
        raise LinkClosed(peer)
    tag, payload = data[:1], data[1:]
    if tag == b"X":
        for fd in fds:
            os.close(fd)
        raise Aborted(payload.decode())
    return tag, payload, fds
