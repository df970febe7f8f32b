"""The ``file_descriptor`` strategy: anonymous shared memory, handed over as a file descriptor.

How it works (torch's default on Linux)::

    shm_open("/mpviz_fd_…", O_CREAT|O_EXCL)  ->  fd          a new object in /dev/shm
    shm_unlink("/mpviz_fd_…")                                 ... and its name is gone at once
    ftruncate(fd, 64 + n)                                     its size
    pwrite(fd, bytes, 64); mmap(fd)                           a 64-byte header, then the storage's bytes:
                                                              the write allocates every page now, not at
                                                              first touch (nothing to write: fallocate
                                                              does; see segment.py and mapping.py)

The memory has no name any more, so nothing can leak into /dev/shm: the kernel frees it when the
last process closes its descriptor and unmaps it. The price is that **every process that holds the
storage keeps one descriptor open** (a thousand small tensors = a thousand fds), and that a
receiver can only get the memory by being *handed* a descriptor by a live holder
(see :mod:`mpviz.sharing.fd_passing`).

Adapted from the ``file_descriptor`` branch of torch's ``reduce_storage`` and ATen's
``MapAllocator`` (``ALLOCATOR_MAPPED_KEEPFD | ALLOCATOR_MAPPED_UNLINK``). Different: torch keeps
no count for these segments (it never reuses them). Left out: the per-process fd cache torch keeps
for storages it received more than once (mpviz's receive cache does that job, one level up).
"""
import errno
import os
import secrets

from ..errors import TooManyFdsError
from ..trace import recorder
from .fd_passing import fd_limit
from .mapping import map_shared
from .segment import HEADER, Hold, Segment, add_at, fill_and_map, fills_every_page, reserve

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not POSIX: the strategy is not offered there
    _posixshmem = None

STRATEGY = "file_descriptor"


class FdHold(Hold):
    """This process's hold: the mapping and the open descriptor (what keeps the memory alive)."""

    strategy = STRATEGY

    def __init__(self, fd, name, nbytes, buf, key, created):
        super().__init__(name, nbytes, buf, key, created)
        self.fd = fd

    def add(self, delta):
        return add_at(self.buf, self.fd, delta)

    def counted_out(self, kept=False):
        if not kept:
            os.close(self.fd)   # the kernel frees the memory when every holder has done the same

    def dropped(self):
        os.close(self.fd)

    def forget(self):
        os.close(self.fd)   # in a forked child: our copy of the parent's descriptor


class FdSegment(Segment):
    """A block of anonymous shared memory that this process holds through an open descriptor.

    **The count in the header** (see :mod:`~mpviz.sharing.segment`, which both strategies share)
    says how many processes map the segment, plus the handles still in flight. The kernel does not
    need it to free the memory; mpviz needs it to know when it may *reuse* a segment: a segment
    whose count is 1, held by us, is mapped by nobody else and named by no message on its way, so
    the caching allocator (:mod:`~mpviz.sharing.allocator`) may hand it out again."""

    def __init__(self, hold):
        super().__init__(hold)
        self.fd = hold.fd


FdHold.segment_class = FdSegment


def _hold(fd, nbytes, name, buf=None, key=None, created=False):
    if key is None:
        stat = os.fstat(fd)
        key = (STRATEGY, stat.st_dev, stat.st_ino)  # the same memory has the same inode everywhere
    if buf is None:
        buf = map_shared(fd, HEADER + max(nbytes, 1))
    return FdHold(fd, name, nbytes, buf, key, created)


def create(nbytes, data=None):
    """Make a new anonymous segment of `nbytes` bytes (at least one page is used for 0), filled
    with `data` (a C-contiguous array of `nbytes` bytes) if given."""
    name = f"/mpviz_fd_{secrets.token_hex(8)}"
    try:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise TooManyFdsError("creating a shared storage", fd_limit()) from None
        raise
    _posixshmem.shm_unlink(name)  # anonymous from now on: nothing can leak
    try:
        reserve(fd, HEADER + max(nbytes, 1), STRATEGY, written=fills_every_page(nbytes, data))
        segment = FdSegment(_hold(fd, nbytes, name, fill_and_map(fd, nbytes, data, STRATEGY), created=True))
    except BaseException:
        os.close(fd)
        raise
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return segment


def from_received_fd(fd, nbytes, name, key=None):
    """Wrap a descriptor handed to us by another process (we now own `fd`, and the handle's count)."""
    segment = FdSegment(_hold(fd, nbytes, name, key=key))
    if recorder.ENABLED:
        recorder.emit("shm.attach", name=name, strategy=STRATEGY, nbytes=nbytes)
    return segment


__all__ = ["FdSegment", "create", "from_received_fd"]
