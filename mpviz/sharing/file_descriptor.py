"""The ``file_descriptor`` strategy: anonymous shared memory, handed over as a file descriptor.

How it works (torch's default on Linux)::

    shm_open("/mpviz_fd_…", O_CREAT|O_EXCL)  ->  fd          a new object in /dev/shm
    shm_unlink("/mpviz_fd_…")                                 ... and its name is gone at once
    ftruncate(fd, n); fallocate(fd, n)                        reserve the pages now, not at first touch
    mmap(fd)                                                  the storage's bytes

The memory has no name any more, so nothing can leak into /dev/shm: the kernel frees it when the
last process closes its descriptor and unmaps it. The price is that **every process that holds the
storage keeps one descriptor open** (a thousand small tensors = a thousand fds), and that a
receiver can only get the memory by being *handed* a descriptor by a live holder
(see :mod:`mpviz.sharing.fd_passing`).

Adapted from the ``file_descriptor`` branch of torch's ``reduce_storage`` and ATen's
``MapAllocator`` (``ALLOCATOR_MAPPED_KEEPFD | ALLOCATOR_MAPPED_UNLINK``). Left out: the
per-process fd cache torch keeps for storages it received more than once (mpviz's receive cache
does that job, one level up).
"""
import errno
import os
import secrets
import weakref

import numpy as np

from ..errors import SharedMemoryFullError, TooManyFdsError
from ..trace import recorder
from .mapping import map_shared

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not POSIX: the strategy is not offered there
    _posixshmem = None

STRATEGY = "file_descriptor"


class FdSegment:
    """A block of anonymous shared memory that this process holds through an open descriptor."""

    strategy = STRATEGY

    def __init__(self, fd, nbytes, name):
        self.fd = fd
        self.nbytes = nbytes
        self.name = name
        stat = os.fstat(fd)
        self.key = (STRATEGY, stat.st_dev, stat.st_ino)  # the same memory has the same inode everywhere
        self.array = np.frombuffer(map_shared(fd, max(nbytes, 1)), dtype=np.uint8, count=nbytes)
        self._finalizer = weakref.finalize(self, _close, fd, name, nbytes)


def _close(fd, name, nbytes):
    # The mapping itself goes when the last NumPy view of it is collected; closing the descriptor
    # here is what gives the memory back once every holder has done the same.
    os.close(fd)
    if recorder.ENABLED:
        recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)


def create(nbytes):
    """Make a new anonymous segment of `nbytes` bytes (at least one page is used for 0)."""
    name = f"/mpviz_fd_{secrets.token_hex(8)}"
    try:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise TooManyFdsError("creating a shared storage", _limit()) from None
        raise
    _posixshmem.shm_unlink(name)  # anonymous from now on: nothing can leak
    try:
        _reserve(fd, max(nbytes, 1), STRATEGY)
    except BaseException:
        os.close(fd)
        raise
    segment = FdSegment(fd, nbytes, name)
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return segment


def from_received_fd(fd, nbytes, name):
    """Wrap a descriptor handed to us by another process (we now own `fd`)."""
    segment = FdSegment(fd, nbytes, name)
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


def _limit():
    import resource
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
