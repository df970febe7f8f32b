"""Handing a file descriptor to another process: a small server per process, over a Unix socket.

A file descriptor is a number that means something only inside one process. To give another
process the same open file, the kernel must copy it across, and the one way for that is a Unix
socket message with ``SCM_RIGHTS`` ancillary data. So the *sender* of a shared storage keeps
the segment open and, when the receiver asks, passes the descriptor over a socket::

    sender (pid 100)                                   receiver (pid 200)
    ----------------                                   ------------------
    encode: token = offer(storage)  --- handle --->    decode: fetch(address, token)
            (keeps it alive)         (via a Queue)        connect once, then reuse:
    server thread:                  <--- b"G"+token --    ask for the token
        pops the offer, sends fd    ---- fd (SCM_RIGHTS) ->  mmap(fd)

Adapted from the idea of CPython's ``multiprocessing/resource_sharer.py`` (one listener thread per
process that serves registered resources by id). What is different here, and why:

* The connection is **persistent**: a receiver connects to a sender once and reuses the socket for
  every later descriptor, instead of connect + authenticate + close per descriptor, as in the
  stdlib. Peers are checked with ``SO_PEERCRED`` (same user only) instead of an HMAC handshake.
* The address is in Linux's abstract socket namespace (no file to clean up).

The rule this makes visible: **the sender must be alive when the receiver unpickles**. If it has
exited, the connection is refused and the receiver gets :class:`mpviz.errors.ProducerExitedError`.
"""
import errno
import itertools
import os
import socket
import struct
import threading
import time

from ..errors import ProducerExitedError, TooManyFdsError
from ..trace import recorder

_REQUEST = struct.Struct("=cQ")  # op (b"G" get, b"R" release), token
_GET, _RELEASE = b"G", b"R"
_FOUND, _MISSING = b"\x00", b"\x01"
RELEASE_DELAY = 0.005  # seconds a release may wait for others to the same sender


class _State:
    """Everything this process knows about fd passing; replaced after fork (the child's own)."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.offers = {}  # token -> the Storage offered, kept alive until fetched or released
        self.tokens = itertools.count(1)
        self.listener = None
        self.address = None
        self.connections = {}  # address -> (socket, lock)
        self.releases = {}     # address -> [(token, sender pid, segment name)] not yet sent
        self.release_due = threading.Condition(self.lock)
        self.flusher = None    # the thread that sends releases RELEASE_DELAY after the first


_state = _State()


def _reset_after_fork():
    # The child inherits the parent's offers and sockets, but not its server thread: it starts
    # afresh and serves only what it offers itself. It must also close its copies of the parent's
    # sockets: while a copy of the listener is open anywhere, a receiver's connect to a parent
    # that has died would still succeed — and then wait forever for an answer.
    global _state
    old, _state = _state, _State()
    if old.listener is not None:
        old.listener.close()
    for sock, _ in old.connections.values():
        sock.close()


os.register_at_fork(after_in_child=_reset_after_fork)


# -- sender side ------------------------------------------------------------------------------

def offer(storage):
    """Keep shared `storage` (and so its segment) alive until a receiver fetches its descriptor,
    or says it needs none; return ``(address, token)`` for the handle.

    Keeping the Storage object, not only its segment, means that if the same memory comes
    straight back (a consumer returning what it got), the receive cache finds that very object,
    and nothing is built again."""
    st = _state
    with st.lock:
        if st.listener is None:
            _start_server(st)
        token = next(st.tokens)
        st.offers[token] = storage
    return st.address, token


def withdraw(token):
    """Take back the offer `token` (its handle will never travel: the message failed to
    pickle). The Storage it kept alive, and so its descriptor, may go now."""
    st = _state
    with st.lock:
        offered = st.offers.pop(token, None)
    if offered is not None and recorder.ENABLED:   # its fd.offer ends here, on no later message
        recorder.emit("fd.withdraw", name=offered._segment.name, token=token)


def pending_offers():
    """How many descriptors this process has promised and not yet handed over."""
    return len(_state.offers)


def _start_server(st):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = f"\0mpviz-fd-{st.pid}-{os.urandom(4).hex()}"
    listener.bind(address)
    listener.listen(64)
    st.listener, st.address = listener, address
    threading.Thread(target=_accept_loop, args=(st,), name="mpviz-fd-server", daemon=True).start()


def _accept_loop(st):
    while True:
        try:
            conn, _ = st.listener.accept()
        except OSError:
            return
        _, uid, _ = peer_credentials(conn)
        if uid != os.getuid():  # only our own user's processes may take our memory
            conn.close()
            continue
        threading.Thread(target=_serve, args=(st, conn), name="mpviz-fd-peer", daemon=True).start()


def _serve(st, conn):
    peer = None
    with conn:
        while True:
            request = _recv_exactly(conn, _REQUEST.size)
            if request is None:
                return  # the receiver went away
            op, token = _REQUEST.unpack(request)
            with st.lock:
                offered = st.offers.pop(token, None)
            if op == _GET:
                if offered is None:
                    conn.sendall(_MISSING)
                else:
                    socket.send_fds(conn, [_FOUND], [offered._segment.fd])
                    if recorder.ENABLED:     # the fd has gone now (its offer was fd.offer)
                        peer = peer or peer_credentials(conn)[0]
                        recorder.emit("fd.send", name=offered._segment.name, token=token,
                                      peer=peer, nbytes=offered._segment.nbytes)
            # Let go now, not at the next request: a segment kept alive here would still count
            # this process as a holder (see file_descriptor's header count).
            offered = None


def _recv_exactly(conn, n):
    data = b""
    while len(data) < n:
        try:
            chunk = conn.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


# -- receiver side ----------------------------------------------------------------------------

def fetch(address, token, sender_pid, segment_name):
    """Ask the sender at `address` for the descriptor it offered as `token`; return the new fd."""
    sock, lock = _connection(address, sender_pid, segment_name)
    with _state.lock:
        waiting = _state.releases.pop(address, ())  # they may ride along
    with lock:
        try:
            sock.sendall(b"".join(_REQUEST.pack(_RELEASE, t) for t, _, _ in waiting)
                         + _REQUEST.pack(_GET, token))
            msg, fds, flags, _ = socket.recv_fds(sock, 1, 1)
        except (ConnectionError, OSError) as e:
            _drop_connection(address)
            if isinstance(e, OSError) and e.errno == errno.EMFILE:
                raise TooManyFdsError("receiving a shared storage", fd_limit()) from None
            raise ProducerExitedError(sender_pid, segment_name) from None
    if not msg:
        _drop_connection(address)
        raise ProducerExitedError(sender_pid, segment_name)
    if msg == _MISSING:
        raise ProducerExitedError(sender_pid, segment_name)  # offer already taken: sender restarted
    if not fds:
        # The kernel drops SCM_RIGHTS descriptors it cannot install (MSG_CTRUNC): we are at the
        # fd limit. stdlib says "received 0 items of ancdata"; say what that means.
        raise TooManyFdsError("receiving a shared storage", fd_limit())
    return fds[0]


def release(address, token, sender_pid, segment_name):
    """Tell the sender we won't fetch `token` (we already map that storage). One-way, and sent
    within ``RELEASE_DELAY`` together with the other releases to the same sender.

    A receiver that already maps the storage asks for nothing: it sends a one-way ``R`` (release)
    so the sender can drop its offer. Releases wait up to ``RELEASE_DELAY`` (5 ms) to travel
    together — one message wakes the sender's server thread once for many of them, instead of
    once per tensor (a wake-up in another process is most of what a release costs) — and go at
    once with the next request to the same sender, or when this process exits."""
    st = _state
    with st.lock:
        if address == st.address:  # a round trip back to ourselves: just drop our own offer
            st.offers.pop(token, None)
            return
        first = not st.releases  # nothing waiting yet: the flusher sleeps until told
        st.releases.setdefault(address, []).append((token, sender_pid, segment_name))
        if st.flusher is None:
            st.flusher = threading.Thread(target=_flush_loop, args=(st,), daemon=True,
                                          name="mpviz-fd-release")
            st.flusher.start()
            _flush_at_exit()
        elif first:
            st.release_due.notify()


def _flush_loop(st):
    while True:
        with st.lock:
            while not st.releases:
                st.release_due.wait()
        time.sleep(RELEASE_DELAY)  # let more releases join this one
        flush_releases(st)


def flush_releases(st=None):
    """Send every release that is waiting now (one message per sender)."""
    st = st or _state
    with st.lock:
        batches, st.releases = st.releases, {}
    for address, waiting in batches.items():
        _, sender_pid, segment_name = waiting[0]
        try:
            sock, lock = _connection(address, sender_pid, segment_name)
            with lock:
                sock.sendall(b"".join(_REQUEST.pack(_RELEASE, t) for t, _, _ in waiting))
        except (OSError, ProducerExitedError, TooManyFdsError):
            _drop_connection(address)  # the sender is gone, and its offers with it


_exit_hook = None


def _flush_at_exit():
    # A multiprocessing child ends with os._exit (no atexit): its Finalize hooks run, though.
    global _exit_hook
    if _exit_hook is None or _exit_hook[0] != os.getpid():
        from multiprocessing import util
        _exit_hook = (os.getpid(), util.Finalize(None, flush_releases, exitpriority=100))
        import atexit
        atexit.register(flush_releases)


def _connection(address, sender_pid, segment_name):
    st = _state
    entry = st.connections.get(address)
    if entry is not None:
        return entry
    sweep()  # a new peer: a good moment to forget the ones that have exited
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EMFILE:
            raise TooManyFdsError("connecting to a sender", fd_limit()) from None
        raise ProducerExitedError(sender_pid, segment_name) from None
    with st.lock:
        entry = st.connections.setdefault(address, (sock, threading.Lock()))
    if entry[0] is not sock:
        sock.close()
    return entry


def sweep():
    """Close connections to senders that have exited (their socket reads as end-of-file)."""
    import select
    for address, (sock, lock) in list(_state.connections.items()):
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            readable = [sock]
        if readable and lock.acquire(blocking=False):
            try:
                if not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    _drop_connection(address)
            except BlockingIOError:
                pass
            except OSError:
                _drop_connection(address)
            finally:
                lock.release()


def infrastructure_fds():
    """Descriptors this process keeps open on purpose: its listener and its live connections."""
    st = _state
    fds = {sock.fileno() for sock, _ in st.connections.values()}
    if st.listener is not None:
        fds.add(st.listener.fileno())
    return fds


def peer_credentials(conn):
    """``(pid, uid, gid)`` of the process at the other end of Unix socket `conn`, as the kernel
    saw it when it connected (``SO_PEERCRED``): what lets a server serve only its own user."""
    return struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))


def _drop_connection(address):
    entry = _state.connections.pop(address, None)
    if entry is not None:
        entry[0].close()


def fd_limit():
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        return None
