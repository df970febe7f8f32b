"""The ``file_descriptor`` strategy: anonymous shared memory, handed over as a file descriptor.

How it works (torch's default on Linux)::

    shm_open("/mpviz_fd_…", O_CREAT|O_EXCL)  ->  fd          a new object in /dev/shm
    shm_unlink("/mpviz_fd_…")                                 ... and its name is gone at once
    ftruncate(fd, 64 + n); fallocate(fd, 64 + n)              reserve the pages now, not at first touch
    mmap(fd); madvise(MADV_POPULATE_WRITE)                    a 64-byte header, then the storage's bytes,
                                                              mapped in one call (see mapping.py)

    +-----------------+-----------------------+---------------+
    | count (8 B)     |  ... 56 B header ...  | the bytes     |
    +-----------------+-----------------------+---------------+

The memory has no name any more, so nothing can leak into /dev/shm: the kernel frees it when the
last process closes its descriptor and unmaps it. The price is that **every process that holds the
storage keeps one descriptor open** (a thousand small tensors = a thousand fds), and that a
receiver can only get the memory by being *handed* a descriptor by a live holder
(see :mod:`mpviz.sharing.fd_passing`).

**The count in the header** (the same one :mod:`~mpviz.sharing.file_system` keeps) says how many
processes map the segment, plus the handles still in flight. The kernel does not need it to free
the memory; mpviz needs it to know when it may *reuse* a segment: a segment whose count is 1,
held by us, is mapped by nobody else and named by no message on its way, so the caching
allocator (:mod:`~mpviz.sharing.allocator`) may hand it out again. The count is changed with one
atomic add on the mapped header (:func:`atomic_add`), the instruction torch's
``RefcountedMapAllocator`` uses (from C: atomic.c; else ctypes and ``libatomic``; else an
``fcntl`` lock).
A holder counts as one until its last NumPy view of the bytes is gone (not just its Storage).

Adapted from the ``file_descriptor`` branch of torch's ``reduce_storage`` and ATen's
``MapAllocator`` (``ALLOCATOR_MAPPED_KEEPFD | ALLOCATOR_MAPPED_UNLINK``). Different: torch keeps
no count for these segments (it never reuses them). Left out: the per-process fd cache torch keeps
for storages it received more than once (mpviz's receive cache does that job, one level up).
"""
import ctypes
import errno
import fcntl
import itertools
import os
import secrets
import struct
import weakref

from ..errors import SharedMemoryFullError, TooManyFdsError
from ..trace import recorder
from .mapping import map_shared, write_into

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not POSIX: the strategy is not offered there
    _posixshmem = None

STRATEGY = "file_descriptor"
HEADER = 64  # bytes before the data: the count, padded to a cache line
_COUNT = struct.Struct("=q")


# -- the count in the header: one atomic add ---------------------------------------------------

_atomic_add = None  # chosen at this process's first mapping, not at import (import stays cheap)


def atomic_add(buf, delta):
    """Add `delta` to the 8-byte count at the start of mapping `buf`, atomically, across processes.

    Returns the new count, or None where this machine has no lock-free 8-byte atomics (the
    caller then takes an ``fcntl`` lock instead). ``delta=0`` reads the count.
    """
    return (_atomic_add or _choose_atomic_add())(buf, delta)


def _choose_atomic_add():
    """This process's atomic add, chosen once. Also called for every new mapping, so that the
    choice (maybe a compile) is made before this process forks: a forked child changes the
    counts in its at-fork hook, and should not be the one that builds atomic.c."""
    global _atomic_add
    if _atomic_add is None:
        _atomic_add = choose_atomic_add()
    return _atomic_add


def choose_atomic_add(which=None):
    """The fastest atomic add this machine has (or the one named by `which`, for tests):

    1. "C": atomic.c, compiled on first use (~50 ns a call; see mpviz/_native.py);
    2. "ctypes": libatomic's ``__atomic_fetch_add_8`` through ctypes (~1.5 µs a call: ctypes
       converts its arguments at run time);
    3. none: a function that returns None, and the callers lock with ``fcntl``.
    """
    if which in (None, "C"):
        from .. import _native as native
        module, problem = native.build(_ATOMIC_C, "mpviz.sharing._atomic")
        if module is not None:
            return module.add
        if which == "C":
            raise RuntimeError(f"the C atomic add is not available here: {problem}")
    fetch_add = _load_libatomic()
    if fetch_add:
        def add(buf, delta):
            return fetch_add(ctypes.addressof(buf), delta, 5) + delta  # 5: __ATOMIC_SEQ_CST
    elif which == "ctypes":
        raise RuntimeError("libatomic's lock-free 8-byte add is not available here")
    else:
        def add(buf, delta):
            return None
    return add


_ATOMIC_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "atomic.c")


def _load_libatomic():
    try:
        lib = ctypes.CDLL("libatomic.so.1")
        fetch_add = lib.__atomic_fetch_add_8
        is_lock_free = lib.__atomic_is_lock_free
    except (OSError, AttributeError):
        return False
    fetch_add.restype, fetch_add.argtypes = ctypes.c_int64, (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)
    is_lock_free.restype, is_lock_free.argtypes = ctypes.c_bool, (ctypes.c_size_t, ctypes.c_void_p)
    # A lock-free add is one CPU instruction on the shared page, so it works across processes.
    # One that is not would take a lock private to this process: useless to the others.
    return fetch_add if is_lock_free(8, None) else False


def _add(buf, fd, delta):
    count = atomic_add(buf, delta)
    if count is None:  # no atomics: hold an fcntl lock on the first 8 bytes while we update
        fcntl.lockf(fd, fcntl.LOCK_EX, _COUNT.size, 0)
        try:
            count = _COUNT.unpack_from(buf, 0)[0] + delta
            _COUNT.pack_into(buf, 0, count)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, _COUNT.size, 0)
    return count


# -- segments -------------------------------------------------------------------------------------

_live = {}  # id -> finalizer of every mapping this process holds (a forked child counts itself in)
_ids = itertools.count()


class FdSegment:
    """A block of anonymous shared memory that this process holds through an open descriptor.

    The hold ends when the last NumPy view of :attr:`array` is gone — not when this object is — so
    that the count never says "nobody maps it" while a view still does.
    """

    strategy = STRATEGY

    def __init__(self, fd, nbytes, name, buf=None, key=None, created=False):
        self.fd = fd
        self.nbytes = nbytes
        self.name = name
        if key is None:
            stat = os.fstat(fd)
            key = (STRATEGY, stat.st_dev, stat.st_ino)  # the same memory has the same inode everywhere
        self.key = key
        _choose_atomic_add()
        self._buf = buf if buf is not None else map_shared(fd, HEADER + max(nbytes, 1))
        import numpy as np  # here, not at the top: a spawned child that sends no tensor never needs it
        self.array = np.frombuffer(self._buf, dtype=np.uint8, count=nbytes, offset=HEADER)
        token = next(_ids)
        self._finalizer = weakref.finalize(self.array, _let_go, token, fd, name, nbytes, self._buf, key,
                                           created)
        _live[token] = self._finalizer

    def incref(self):
        """Count one more holder or handle in flight (a storage being pickled)."""
        return _add(self._buf, self.fd, +1)

    def decref(self):
        """Count one fewer (a handle arrived where the storage was already mapped)."""
        return _add(self._buf, self.fd, -1)

    def refcount(self):
        return _add(self._buf, self.fd, 0)


def _let_go(token, fd, name, nbytes, buf, key, created):
    # The last view of the bytes is gone. Either the caching allocator keeps the segment (and our
    # count) to hand it out again — only segments we created: a receiver that kept what it was
    # sent would stop its producer from ever reusing it — or we count ourselves out and close the
    # descriptor; the kernel frees the memory when every holder has done the same.
    _live.pop(token, None)
    from . import allocator
    if created:
        if allocator.park(_Parked(fd, name, nbytes, buf, key)):
            return
    elif allocator.enabled():
        # received: count ourselves out now (the producer may reuse it), and keep the mapping
        # (and the descriptor) while someone else still counts it — see the allocator
        if _add(buf, fd, -1) > 0 and allocator.keep_received(_Kept(fd, name, nbytes, buf, key)):
            if recorder.ENABLED:
                recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)
                recorder.emit("shm.cache", kept=True, name=name, strategy=STRATEGY, nbytes=nbytes)
            return
        _close(fd, name, nbytes)  # not kept: we are counted out already
        return
    _release(fd, name, nbytes, buf)


def _release(fd, name, nbytes, buf):
    _add(buf, fd, -1)
    _close(fd, name, nbytes)


def _close(fd, name, nbytes):
    os.close(fd)
    if recorder.ENABLED:
        recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)


class _Parked:
    """A segment nobody here uses any more, kept by the allocator with our count still in it."""

    strategy = STRATEGY

    def __init__(self, fd, name, nbytes, buf, key):
        self.fd, self.name, self.nbytes, self.buf, self.key = fd, name, nbytes, buf, key

    def sole_holder(self):
        """True when the count is 1 — ours: no other process maps it, no handle names it."""
        return _add(self.buf, self.fd, 0) == 1

    def revive(self):
        """A live segment again, with the count we kept."""
        return FdSegment(self.fd, self.nbytes, self.name, self.buf, self.key, created=True)

    def free(self):
        _release(self.fd, self.name, self.nbytes, self.buf)

    def forget(self):
        """In a forked child: the parent's count, not ours. Close our copy and say nothing."""
        os.close(self.fd)


class _Kept:
    """A received segment nobody here uses any more, kept mapped (and its descriptor open) with
    our count given back, in case the same memory arrives again (see the allocator)."""

    strategy = STRATEGY

    def __init__(self, fd, name, nbytes, buf, key):
        self.fd, self.name, self.nbytes, self.buf, self.key = fd, name, nbytes, buf, key

    def orphaned(self):
        """True when no other process counts this memory: keeping it would keep it alive."""
        return _add(self.buf, self.fd, 0) <= 0

    def revive(self):
        """Ours again: the arriving handle's count becomes ours, as in ``from_received_fd``."""
        if recorder.ENABLED:
            recorder.emit("shm.attach", name=self.name, strategy=STRATEGY, nbytes=self.nbytes,
                          kept=True)
        return FdSegment(self.fd, self.nbytes, self.name, self.buf, self.key)

    def free(self):
        os.close(self.fd)   # the count was given back when it was kept; the map goes with buf

    def forget(self):
        os.close(self.fd)


def create(nbytes, data=None):
    """Make a new anonymous segment of `nbytes` bytes (at least one page is used for 0), filled
    with `data` (a C-contiguous array of `nbytes` bytes) if given."""
    name = f"/mpviz_fd_{secrets.token_hex(8)}"
    try:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise TooManyFdsError("creating a shared storage", _limit()) from None
        raise
    _posixshmem.shm_unlink(name)  # anonymous from now on: nothing can leak
    try:
        _reserve(fd, HEADER + max(nbytes, 1), STRATEGY)
        buf = _fill_and_map(fd, nbytes, data)
        segment = FdSegment(fd, nbytes, name, buf=buf, created=True)
    except BaseException:
        os.close(fd)
        raise
    _COUNT.pack_into(segment._buf, 0, 1)  # nobody else can see it yet
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return segment


def from_received_fd(fd, nbytes, name, key=None):
    """Wrap a descriptor handed to us by another process (we now own `fd`, and the handle's count)."""
    segment = FdSegment(fd, nbytes, name, key=key)
    if recorder.ENABLED:
        recorder.emit("shm.attach", name=name, strategy=STRATEGY, nbytes=nbytes)
    return segment


def _reserve(fd, size, strategy):
    """Size the object and allocate its pages now, so a full /dev/shm is an error here, not a
    SIGBUS at first touch (torch learnt this the hard way: PR #161910)."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SharedMemoryFullError(size, strategy) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # some filesystems can't; ftruncate did
            raise


def _fill_and_map(fd, nbytes, data):
    """Map a new, reserved segment; with `data`, write its bytes in first (one pass: see
    mapping.write_into). Without, map every page now, in one call, for the caller's copy."""
    if data is None:
        return map_shared(fd, HEADER + max(nbytes, 1), populate=True)
    write_into(fd, data, HEADER)
    return map_shared(fd, HEADER + max(nbytes, 1))


def _limit():
    import resource
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- fork and exit: keep the count true --------------------------------------------------------

def _count_inherited_after_fork():
    # A forked child maps every segment its parent mapped: count it in, or the parent could
    # reuse memory the child still sees.
    for finalizer in list(_live.values()):
        info = finalizer.peek()
        if info is not None:
            _, fd, _, _, buf, _, _ = info[2]
            try:
                _add(buf, fd, +1)
            except OSError:
                pass


os.register_at_fork(after_in_child=_count_inherited_after_fork)


def release_all():
    """Count this process out of every segment it maps (a multiprocessing child, at exit)."""
    for finalizer in list(_live.values()):
        finalizer()
