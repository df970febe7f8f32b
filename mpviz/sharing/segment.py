"""A shared segment, whichever strategy made it: a counted header, the bytes, one process's hold.

    +-----------------+-----------------------+---------------+
    | count (8 B)     |  ... 56 B header ...  | the bytes     |     one tmpfs file, mapped whole
    +-----------------+-----------------------+---------------+

* **The count**: how many processes map the segment, plus the handles in flight. It changes by
  one atomic add on the mapped page (atomic.c; else libatomic; else an ``fcntl`` lock).
* **A hold** (:class:`Hold`): what one process keeps of a segment, the mapping and a descriptor
  (file_descriptor) or a name (file_system). It lasts until the last NumPy view of
  :attr:`Segment.array` is gone, so a count of 1 really means "nobody else maps it". Then the
  allocator may park it (:class:`Parked`) or keep a received one (:class:`Kept`); else it
  counts itself out.
* **Fork and exit keep the count true**: a forked child counts itself into every segment it
  inherits; a multiprocessing child counts itself out of all of them as it exits.

Each strategy file only makes, attaches and hands over segments, and says in its Hold how to add
to the count and what else goes with letting go. Adapted from ATen's ``RefcountedMapAllocator``.
"""
import ctypes
import errno
import fcntl
import itertools
import os
import struct
import weakref

from ..errors import SharedMemoryFullError
from ..trace import recorder
from . import allocator
from .mapping import map_shared, write_into

HEADER = 64  # bytes before the data: the count, padded to a cache line
COUNT = struct.Struct("=q")


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

    1. "C": mpviz/_speedups/atomic.c, compiled on first use (~50 ns a call; see there);
    2. "ctypes": libatomic's ``__atomic_fetch_add_8`` through ctypes (~1.5 µs a call: ctypes
       converts its arguments at run time);
    3. none: a function that returns None, and the callers lock with ``fcntl``.
    """
    if which in (None, "C"):
        from .. import _speedups
        module, problem = _speedups.build(_speedups.source("atomic.c"), "mpviz._speedups._atomic")
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


def add_at(buf, fd, delta, at=0):
    """Add `delta` to the count at byte `at` of mapping `buf` of file `fd`: atomically, or
    (no atomics here) under an ``fcntl`` lock on those 8 bytes of the file. The new count."""
    count = atomic_add((ctypes.c_char * 8).from_buffer(buf, at) if at else buf, delta)
    if count is None:
        fcntl.lockf(fd, fcntl.LOCK_EX, COUNT.size, at)
        try:
            count = COUNT.unpack_from(buf, at)[0] + delta
            COUNT.pack_into(buf, at, count)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, COUNT.size, at)
    return count


# -- a new segment: its pages reserved, its bytes in --------------------------------------------

def reserve(fd, size, strategy, written=False):
    """Size the object, and allocate its pages now, so that a full /dev/shm is an error here, not
    a SIGBUS at first touch (torch learnt this the hard way: PR #161910).

    `written`: the caller's bytes are about to be written over every page (see
    :func:`fill_and_map`). Then the write allocates each page as it fills it, and a full
    /dev/shm makes the write fail with the same ENOSPC: allocating them first would walk all
    the pages twice (fallocate, then the write looking each one up again)."""
    os.ftruncate(fd, size)
    if written:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SharedMemoryFullError(size, strategy) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # some filesystems can't; ftruncate did
            raise


def fills_every_page(nbytes, data):
    """True when writing `data` after the header puts a byte on every page of the segment: then
    the write reserves the pages (:func:`reserve` with ``written=True``). A 0-byte tensor writes
    nothing, and its one page must be reserved the ordinary way."""
    return data is not None and nbytes > 0


def fill_and_map(fd, nbytes, data, strategy=None):
    """Map a new, reserved segment, its count 1; with `data`, write its bytes in first (one pass:
    see mapping.write_into). Without, map every page now, in one call, for the caller's copy.
    With the cache on, map them now too: the segment may come back for a copy into it, and one
    call maps pages that are there already for less than a fault each at that copy.

    A write that finds /dev/shm full raises :class:`SharedMemoryFullError` (for `strategy`),
    as fallocate does: the pages it did fill go when the caller closes (and unlinks) the file."""
    if data is not None:
        try:
            write_into(fd, data, HEADER)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise SharedMemoryFullError(HEADER + max(nbytes, 1), strategy) from None
            raise
    buf = map_shared(fd, HEADER + max(nbytes, 1), populate=data is None or allocator.enabled())
    COUNT.pack_into(buf, 0, 1)  # nobody else can see it yet
    return buf


# -- one process's hold, and what becomes of it ------------------------------------------------

class Hold:
    """What this process holds of one segment besides its views: the mapping `buf` (and, in a
    strategy's subclass, a descriptor or a name). A strategy says how to change the count
    (:meth:`add`) and what else goes when our count does (the ``counting_*`` steps)."""

    strategy = None
    segment_class = None   # the strategy's Segment, to make a live segment of a kept hold

    def __init__(self, name, nbytes, buf, key, created):
        self.name, self.nbytes, self.buf, self.key, self.created = name, nbytes, buf, key, created

    def add(self, delta):
        """Add `delta` to the count; the new count."""
        raise NotImplementedError

    def counting_out(self):
        """Our count is about to go (file_system tells its shm manager)."""

    def give_back(self):
        """Give our count back; the new count."""
        return self.add(-1)

    def counted_out(self, kept=False):
        """Our count is gone: let go of the rest (a descriptor; the manager's record), or, `kept`,
        keep the mapping (the allocator's Kept)."""

    def dropped(self):
        """A kept mapping, whose count went when it was kept, goes too."""
        self.counted_out()

    def counted_in(self, kept=False):
        """Our count is back: after a fork, or (`kept`) a kept mapping taken up again."""

    def reused(self):
        """A parked segment goes back to work (file_system forgets its old channels)."""

    def orphaned(self):
        """True when no other process counts this memory: keeping it would keep it alive."""
        return self.add(0) <= 0

    def forget(self):
        """In a forked child: what the parent kept is the parent's. Let go, and count nothing."""


class Segment:
    """A live segment that this process holds: :attr:`array` is a NumPy view of its bytes."""

    def __init__(self, hold):
        self._hold = hold
        self.strategy, self.name, self.nbytes, self.key = hold.strategy, hold.name, hold.nbytes, hold.key
        self.created = hold.created    # made here (not received): the allocator may park it
        self._buf = hold.buf
        _choose_atomic_add()           # before any fork: see there
        import numpy as np  # here, not at the top: a spawned child that sends no tensor never needs it
        self.array = np.frombuffer(hold.buf, dtype=np.uint8, count=hold.nbytes, offset=HEADER)
        token = next(_ids)
        self._finalizer = weakref.finalize(self.array, _let_go, token, hold)
        _live[token] = self._finalizer

    def incref(self):
        """Count one more holder or handle in flight (a storage being pickled)."""
        return self._hold.add(+1)

    def decref(self):
        """Count one fewer (a handle arrived where the storage was already mapped)."""
        return self._hold.add(-1)

    def refcount(self):
        return self._hold.add(0)


_live = {}  # id -> finalizer of every mapping this process holds (a forked child counts itself in)
_ids = itertools.count()


def _let_go(token, hold):
    # The last view of the bytes is gone. Either the caching allocator keeps the segment (and our
    # count) to hand it out again — only segments we created: a receiver that kept what it was
    # sent would stop its producer from ever reusing it — or we count ourselves out.
    _live.pop(token, None)
    if hold.created:
        if allocator.park(Parked(hold)):
            return
    elif allocator.enabled():
        # received: count ourselves out now (the producer may reuse it), and keep the mapping
        # while someone else still counts it (see the allocator)
        _emit("shm.detach", hold)
        hold.counting_out()
        if hold.give_back() > 0 and allocator.keep_received(Kept(hold)):
            hold.counted_out(kept=True)
            _emit("shm.cache", hold, kept=True)
            return
        hold.counted_out()  # not kept
        return
    release(hold)


def release(hold):
    """Count this process out of the segment for good."""
    _emit("shm.detach", hold)
    hold.counting_out()
    hold.give_back()
    hold.counted_out()


def _emit(kind, hold, **extra):
    if recorder.ENABLED:
        recorder.emit(kind, name=hold.name, strategy=hold.strategy, nbytes=hold.nbytes, **extra)


class _Idle:
    """A hold that no view here uses any more, kept by the allocator (the two kinds below)."""

    def __init__(self, hold):
        self.hold = hold
        self.strategy, self.name, self.nbytes, self.key = hold.strategy, hold.name, hold.nbytes, hold.key

    def forget(self):
        self.hold.forget()


class Parked(_Idle):
    """A segment nobody here uses any more, kept by the allocator with our count still in it."""

    def sole_holder(self):
        """True when the count is 1 — ours: no other process maps it, no handle names it."""
        return self.hold.add(0) == 1

    def revive(self):
        """A live segment again, with the count we kept."""
        self.hold.reused()
        return self.hold.segment_class(hold=self.hold)

    def free(self):
        release(self.hold)


class Kept(_Idle):
    """A received segment nobody here uses any more, kept mapped with our count given back, in
    case the same memory arrives again (see the allocator)."""

    def orphaned(self):
        return self.hold.orphaned()

    def revive(self):
        """Ours again: the arriving handle's count becomes ours, as in an attach."""
        self.hold.counted_in(kept=True)
        _emit("shm.attach", self.hold, kept=True)
        return self.hold.segment_class(hold=self.hold)

    def free(self):
        self.hold.dropped()       # the count was given back when it was kept


# -- fork and exit: keep the count true --------------------------------------------------------

_for_the_child = []   # the holds counted for a child about to be forked


def _count_the_child_in_before_fork():
    # A forked child maps every segment its parent mapped: count it in, or the first of the two
    # to let go could unlink the other's name, or the allocator reuse memory the child still
    # sees. Here, before the fork, not in the child: a parent that lets go right after start()
    # (Process.start() drops its args) would otherwise race the child's count, and unlink a
    # name the child maps. (A fork that fails leaves these counts: the names are kept longer.)
    _for_the_child.clear()
    for finalizer in list(_live.values()):
        info = finalizer.peek()
        if info is None:
            continue
        hold = info[2][1]
        try:
            hold.add(+1)
        except OSError:
            continue
        _for_the_child.append(hold)


def _count_inherited_after_fork():
    # The child tells the manager what it holds (killed before it does: the name is kept longer).
    for hold in _for_the_child:
        try:
            hold.counted_in()
        except OSError:
            pass
    _for_the_child.clear()


os.register_at_fork(before=_count_the_child_in_before_fork,
                    after_in_parent=_for_the_child.clear,
                    after_in_child=_count_inherited_after_fork)


def release_all():
    """Count this process out of every segment it maps (a multiprocessing child, at exit)."""
    allocator.close()  # from here on nothing is kept for reuse; what was kept is given back
    for finalizer in list(_live.values()):
        finalizer()


# multiprocessing's fork and forkserver children end with os._exit(), which skips atexit, and so
# skips the weakref finalizers that give our counts back. Their bootstrap does run
# multiprocessing's own exit finalizers: hook the release in there.
class _ChildExitHook:
    def __call__(self, _):
        from multiprocessing import util
        util.Finalize(None, release_all, exitpriority=-100)


_hook = _ChildExitHook()


def _register_child_exit_hook():
    from multiprocessing import util
    util.register_after_fork(_hook, _hook)


_register_child_exit_hook()
