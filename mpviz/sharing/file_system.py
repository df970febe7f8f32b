"""The ``file_system`` strategy: named segments in /dev/shm, handed over by name, reference counted.

How it works::

    /dev/shm/mpviz_3f9c…  (mode 0600)
    +-----------------+--------------------------------------+
    | refcount (8 B)  |  ... 56 B header ...  | the bytes     |
    +-----------------+--------------------------------------+
      how many holders and in-flight handles exist, in all processes

* ``create``: ``shm_open(O_CREAT|O_EXCL)``, size it, map it, **close the descriptor** (holders
  keep no fds: that is this strategy's advantage), refcount = 1.
* Pickling a storage adds 1 for the handle in flight; the receiver that opens it by name takes
  that reference over. Each holder that lets go subtracts 1; **whoever brings it to 0 unlinks
  the name**. The count is updated under an ``fcntl`` lock on the segment, so two processes
  never lose an update.
* A process killed by SIGKILL never subtracts its 1: the name would stay in /dev/shm until the
  machine reboots. That is the leak the :mod:`~mpviz.sharing.shm_manager` exists for — every holder
  tells it what it holds, and it unlinks what no live process holds.

Adapted from torch's ``RefcountedMapAllocator`` (ATen ``MapAllocator.cpp``: a 64-byte header with
an atomic refcount in front of the data) and ``libshm``. Simplified: an ``fcntl`` lock instead of
an atomic add, because Python has no atomics on shared memory.
"""
import errno
import fcntl
import mmap
import os
import secrets
import struct
import weakref

import numpy as np

from ..errors import SegmentGoneError, TooManyFdsError
from ..trace import recorder
from . import shm_manager
from .file_descriptor import _reserve
from .mapping import map_shared

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

STRATEGY = "file_system"
HEADER = 64
_COUNT = struct.Struct("=q")
PREFIX = "/mpviz_"

_live = weakref.WeakSet()  # every FsSegment of this process, so a forked child can count itself in


class FsSegment:
    """A named segment that this process holds one reference to (no descriptor kept open)."""

    strategy = STRATEGY

    def __init__(self, name, nbytes, buf):
        self.name = name
        self.nbytes = nbytes
        self.key = (STRATEGY, name)
        self.array = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=HEADER)
        self._finalizer = weakref.finalize(self, _let_go, name, nbytes)
        _live.add(self)


def _let_go(name, nbytes):
    if recorder.ENABLED:
        recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)
    decref(name)
    shm_manager.client().drop(name)


def create(nbytes):
    """Make a new named segment of `nbytes` bytes, held once by this process."""
    name = PREFIX + secrets.token_hex(10)
    shm_manager.client().hold(name)  # tell the manager first: if we die right after, it still knows
    fd = _open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    try:
        _reserve(fd, HEADER + max(nbytes, 1), STRATEGY)
        buf = map_shared(fd, HEADER + max(nbytes, 1))
    except BaseException:
        os.close(fd)
        _posixshmem.shm_unlink(name)
        raise
    os.close(fd)  # holders keep no descriptor: the mapping is enough
    _COUNT.pack_into(buf, 0, 1)
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return FsSegment(name, nbytes, buf)


def attach(name, nbytes):
    """Map the segment `name`, taking over one reference that the sender counted for us."""
    shm_manager.client().hold(name)
    try:
        fd = _open(name, os.O_RDWR)
    except FileNotFoundError:
        shm_manager.client().drop(name)
        raise SegmentGoneError(name) from None
    try:
        buf = map_shared(fd, HEADER + max(nbytes, 1))
    finally:
        os.close(fd)
    if recorder.ENABLED:
        recorder.emit("shm.attach", name=name, strategy=STRATEGY, nbytes=nbytes)
    return FsSegment(name, nbytes, buf)


def incref(name):
    """Count one more holder or in-flight handle of `name`; return the new count."""
    return _add(name, +1)


def decref(name):
    """Count one holder fewer; unlink the name when nobody is left. Return the new count."""
    return _add(name, -1)


def refcount(name):
    """The current count of `name` (for pictures and tests); None if the name is gone."""
    try:
        return _add(name, 0)
    except FileNotFoundError:
        return None


def _add(name, delta):
    try:
        fd = _open(name, os.O_RDWR)
    except FileNotFoundError:
        if delta == 0:
            raise
        return 0  # already unlinked (by the manager, or by hand): nothing left to count
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, _COUNT.size, 0)
        with mmap.mmap(fd, HEADER) as header:
            count = _COUNT.unpack_from(header, 0)[0] + delta
            _COUNT.pack_into(header, 0, count)
        if count <= 0 and delta < 0:
            _posixshmem.shm_unlink(name)
            shm_manager.client().unlinked(name)
            if recorder.ENABLED:
                recorder.emit("shm.unlink", name=name, strategy=STRATEGY, by="refcount")
    finally:
        os.close(fd)  # also drops the lock
    return count


def _open(name, flags):
    try:
        return _posixshmem.shm_open(name, flags, 0o600)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise TooManyFdsError(f"opening shared memory {name}") from None
        raise


def _count_inherited_after_fork():
    # A forked child holds every segment its parent held (same mappings): count it as a holder,
    # or the first of the two to let go would unlink the other's name.
    for segment in list(_live):
        try:
            incref(segment.name)
            shm_manager.client().hold(segment.name)
        except OSError:
            pass


os.register_at_fork(after_in_child=_count_inherited_after_fork)


# multiprocessing's fork and forkserver children end with os._exit(), which skips atexit, and so
# skips the weakref finalizers that give our references back. Their bootstrap does run
# multiprocessing's own exit finalizers: hook the release in there.
class _ChildExitHook:
    def __call__(self, _):
        from multiprocessing import util
        util.Finalize(None, _release_all, exitpriority=-100)


def _release_all():
    for segment in list(_live):
        segment._finalizer()


_hook = _ChildExitHook()


def _register_child_exit_hook():
    from multiprocessing import util
    util.register_after_fork(_hook, _hook)


_register_child_exit_hook()
