"""The store: a small key-value server that rank 0 runs and every rank reaches by TCP.

    rank 0                                   rank 1, 2, ...
    ------                                   --------------
    listen(127.0.0.1:MASTER_PORT)    <-----  connect(MASTER_ADDR:MASTER_PORT)  (retried until timeout)
      one thread per connection  -----  HMAC challenge with the job's secret
      {key: value} + a Condition                ("set", k, v) ("get", k) ("add", k, n) ("note", k, v)

The store is how ranks find each other (the *rendezvous*, ``init_process_group``) and where they
leave notes as they enter collectives (so that a timeout can say who did not arrive). It never
carries tensors: those go through shared memory (ring.py).

**Who may connect.** A TCP port on 127.0.0.1 is open to every user of the machine, and TCP has no
``SO_PEERCRED``. So every connection starts with ``multiprocessing.connection``'s HMAC challenge
on a per-job secret that only this user can read: ``MPVIZ_DIST_SECRET`` if every rank has it
set, else a random key rank 0 writes to a private file (0600, in a 0700 directory of this user)
named after the port -- or, for ``file://`` init, into the rendezvous file itself. A process of
another user fails the challenge and is dropped; and a rank checks the server the same way before
it reads a reply (a reply is a pickle: from a stranger on the port, it could run code). The key
file is removed once every rank has joined (or by ``close()``, or at exit): only a rank 0 killed
during the rendezvous leaves it behind.

Adapted from torch's ``TCPStore`` (c10d/TCPStore.cpp): same roles and the same error wording where
torch has one; left out: the libuv server, multi-tenant stores, compare_set, IPv6.
"""
import errno
import os
import secrets
import socket
import stat
import tempfile
import threading
import time
from multiprocessing import util
from multiprocessing.connection import (AuthenticationError, Connection, answer_challenge,
                                        deliver_challenge)

from .errors import DistNetworkError, DistStoreError


# -- the secret: who may talk to this store ---------------------------------------------------

def _private_dir():
    """``<tmp>/mpviz-dist-<uid>``, made 0700 if missing; refused if it is not ours and private."""
    path = os.path.join(tempfile.gettempdir(), f"mpviz-dist-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise DistStoreError(
            f"{path} is not a private directory of this user (owner uid {st.st_uid}, mode "
            f"{oct(st.st_mode & 0o777)}): the store's key would not be secret there. "
            f"Fix: remove it, or set MPVIZ_DIST_SECRET to the same random string in every rank.")
    return path


def _write_private(path, text):
    """Write `text` to `path` (0600) without following a planted symlink: a new file, renamed over."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _read_private(path):
    """The text of `path` if it exists, is ours and is private; else None (not written yet)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        return f.read()


def _write_rendezvous_file(path, text):
    """file:// init: rank 0 writes its port and key into the file the ranks share."""
    try:
        _write_private(path, text)
    except OSError as e:
        raise DistStoreError(
            f"cannot write the rendezvous file {path} (init_method file://{path}): "
            f"{e.strerror}. Why: rank 0 writes its store's port and key there for the other "
            f"ranks to read. Fix: name a file (new or yours) in a directory you can write, the "
            f"same in every rank, e.g. init_method='file:///tmp/my_job_rendezvous'.") from None


def key_file(host, port):
    return os.path.join(_private_dir(), f"{host}-{port}.key")


# -- the server (rank 0) ------------------------------------------------------------------------

class _Server:
    """The dict and the threads that serve it. Lives in rank 0 until ``close()``."""

    def __init__(self, host, port, secret, port_from="MASTER_PORT"):
        self.secret = secret
        try:
            self.listener = socket.create_server((host, port))   # SO_REUSEADDR, as torch's
        except OSError as e:
            name = errno.errorcode.get(e.errno, "?")
            raise DistNetworkError(
                f"The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: false, code: -{e.errno}, name: {name}, "
                f"message: {os.strerror(e.errno).lower()}. Why: another process (maybe an "
                f"earlier run that is still alive) holds port {port}. Fix: choose a free "
                f"{port_from}, or stop the other process (`ss -ltnp | grep {port}` shows "
                f"it).") from None
        self.port = self.listener.getsockname()[1]
        self.data = {}
        self.changed = threading.Condition()   # guards data, sockets, closing
        self.sockets, self.threads, self.closing = [], [], False
        self._start(self._accept)

    def _start(self, target, *args):
        thread = threading.Thread(target=target, args=args, name="mpviz-store", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return                       # shut down by close()
            with self.changed:
                if self.closing:
                    sock.close()
                    return
                self.sockets.append(sock)
            self._start(self._serve, sock)

    def _serve(self, sock):
        """One rank's connection. Only this thread closes it; close() shuts it down to wake it."""
        conn = Connection(os.dup(sock.fileno()))
        try:
            deliver_challenge(conn, self.secret)   # HMAC: does the peer know the job's secret?
            answer_challenge(conn, self.secret)    # ... and prove that we do (as Listener)
            while True:
                request = conn.recv()
                reply = self._handle(*request)
                if request[0] != "note":
                    conn.send(reply)
        except (EOFError, OSError, AuthenticationError):
            pass                             # gone, closed, or the wrong secret: dropped
        finally:
            conn.close()
            with self.changed:
                self.sockets.remove(sock)
                sock.close()

    def _handle(self, command, key=None, value=None, timeout=None):
        with self.changed:
            if command in ("set", "note"):
                self.data[key] = value
                self.changed.notify_all()
            elif command == "add":
                self.data[key] = self.data.get(key, 0) + value
                self.changed.notify_all()
                return self.data[key]
            elif command == "get":           # wait for the key: how a rank waits for the others
                self.changed.wait_for(lambda: self.closing or key in self.data, timeout)
                return self.data.get(key, _MISSING)
            elif command == "get_many":      # no wait: what is there now (a timeout's report)
                return {k: self.data[k] for k in key if k in self.data}
            elif command == "wait_count":    # wait until data[key] >= value
                self.changed.wait_for(lambda: self.closing or self.data.get(key, 0) >= value,
                                      timeout)
                return self.data.get(key, 0)

    def close(self):
        """Stop serving: wake every thread (shutdown wakes a blocked accept/recv), wait for them."""
        with self.changed:
            self.closing = True
            self.changed.notify_all()
            for sock in self.sockets:
                _shutdown(sock)
        _shutdown(self.listener)
        for thread in list(self.threads):
            thread.join(5)
        self.listener.close()


def _shutdown(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass                                 # not connected (any more)


_MISSING = "<mpviz.distributed: no such key>"


# -- the client (every rank, rank 0 too) -------------------------------------------------------

def _client(address, secret):
    """A connection to the store that passed its challenge (multiprocessing's Client, by hand).

    Both ways, as ``Client(address, authkey=...)``: the rank proves it knows the secret, then
    the server must prove it too -- before the rank unpickles a single reply. Whoever listens on
    MASTER_PORT before rank 0 does (or after it died) could otherwise send a pickle that runs
    code in this rank."""
    conn = Connection(socket.create_connection(address).detach())
    try:
        answer_challenge(conn, secret)
        deliver_challenge(conn, secret)
        return conn
    except BaseException:
        conn.close()
        raise


class TCPStore:
    """Torch's name: a store at (host, port); ``is_master=True`` (rank 0) also runs the server.

    `secret_at`: where the secret is (a key file or the ``file://`` rendezvous file), read again
    at each try to connect, so a rank that starts before rank 0 waits for it.
    """

    def __init__(self, host, port, is_master, timeout, secret=None, address_file=None,
                 port_from="MASTER_PORT"):
        self.timeout = timeout
        self.address_file = address_file
        self._key_file = None
        self.server = None
        deadline = time.monotonic() + timeout
        if secret is None and os.environ.get("MPVIZ_DIST_SECRET"):
            secret = os.environ["MPVIZ_DIST_SECRET"].encode()   # every rank knows it already
        if is_master:
            secret = secret or secrets.token_bytes(32)
            self.server = _Server(host, port, secret, port_from)
            port = self.server.port
            try:
                if address_file is not None:  # file:// init: the file says where, and the key
                    _write_rendezvous_file(address_file, f"{port} {secret.hex()}")
                elif not os.environ.get("MPVIZ_DIST_SECRET"):
                    self._key_file = key_file(host, port)
                    _write_private(self._key_file, secret.hex())
            except BaseException:
                self.server.close()           # nobody can find it: stop listening
                raise
            for path in (self._key_file, address_file):   # also if the program never calls close()
                if path is not None:
                    util.Finalize(self, _unlink, args=(path,), exitpriority=0)
        self.host, self.port = host, port
        self.conn = self._connect(secret, deadline)
        self.lock = threading.Lock()

    def _where(self, secret):
        """(port, secret) to try now, or None if rank 0 has not said yet."""
        if self.address_file is not None:
            text = _read_private(self.address_file)
            if not text or " " not in text:
                return None
            port, key = text.split()
            return int(port), bytes.fromhex(key)
        if secret is None:
            text = _read_private(key_file(self.host, self.port))
            if not text:
                return None
            secret = bytes.fromhex(text)
        return self.port, secret

    def _connect(self, secret, deadline):
        pause = 0.001
        while True:
            where = self._where(secret)
            if where is not None:
                try:
                    return _client((self.host, where[0]), where[1])
                except (ConnectionRefusedError, AuthenticationError, EOFError):
                    pass                     # not listening yet, or a stale key: try again
            if time.monotonic() >= deadline:
                raise DistNetworkError(
                    f"The client socket has timed out after {int(self.timeout * 1000)}ms while "
                    f"trying to connect to ({self.host}, {self.port}). Why: no rank 0 listens "
                    f"there with this job's key (rank 0 not started, crashed, or given another "
                    f"MASTER_ADDR/MASTER_PORT or init_method). Fix: start rank 0 too, with the same "
                    f"address; check that ranks run 0 .. world_size-1.")
            time.sleep(pause)                # the connect retry (torch's backoff, simplified)
            pause = min(pause * 2, 0.05)

    def _ask(self, *request):
        try:
            with self.lock:
                self.conn.send(request)
                return self.conn.recv()
        except (OSError, EOFError):
            raise DistStoreError(
                f"the store (rank 0, port {self.port}) closed the connection during "
                f"{request[0]}({request[1]!r}). Why: rank 0 exited, or gave up waiting (its own "
                f"error says why, e.g. ranks that never joined). Fix: fix rank 0's error first.")

    def set(self, key, value):
        self._ask("set", key, value)

    def note(self, key, value):
        """Set without waiting for an answer: one send (a rank's "I entered collective #n")."""
        with self.lock:
            self.conn.send(("note", key, value))

    def add(self, key, amount):
        return self._ask("add", key, amount)

    def get(self, key, timeout=None):
        """The value of `key`, waiting up to `timeout` seconds for some rank to set it."""
        value = self._ask("get", key, None, self.timeout if timeout is None else timeout)
        if isinstance(value, str) and value == _MISSING:
            raise DistStoreError(f"Timed out after {self.timeout:g} seconds waiting for key {key!r}")
        return value

    def get_many(self, keys):
        return self._ask("get_many", list(keys))

    def wait_count(self, key, value, timeout):
        """Wait until the counter `key` reaches `value`; return what it reached."""
        return self._ask("wait_count", key, value, timeout)

    def forget_secret(self):
        """Remove the key file (or file:// file): every rank has connected, none reads it again.
        Done once all have joined, so that a rank 0 killed later leaves nothing behind."""
        for path in (self._key_file, self.address_file):
            if path is not None and self.server is not None:
                _unlink(path)

    def close(self):
        try:
            self.conn.close()
        except OSError:
            pass
        if self.server is not None:
            self.server.close()
            for path in (self._key_file, self.address_file):
                if path is not None:
                    _unlink(path)
            self.server = None


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
