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
"""
import os
import secrets
import socket
import time

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

    def connect(self, tag, peer, deadline):
        """A socket to `peer`'s listener, introduced as (tag, this rank)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        while True:
            try:
                sock.connect(_address(self.job, peer))
                break
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() >= deadline:   # its listener exists once it joined the store
                    sock.close()
                    raise LinkTimeout(peer) from None
                time.sleep(0.001)
        _check_peer(sock)
        sock.send(f"{tag} {self.rank} {self.job}".encode())
        return sock

    def accept(self, tag, peer, deadline):
        """The socket `peer` connected as (tag, peer), accepting others on the way."""
        while (tag, peer) not in self.accepted:
            self.listener.settimeout(max(deadline - time.monotonic(), 0.0001))
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                raise LinkTimeout(peer) from None
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
