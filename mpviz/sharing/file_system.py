"""The ``file_system`` strategy: named segments in /dev/shm, handed over by name, reference counted.

How it works::

    /dev/shm/mpviz_3f9c…  (mode 0600)
    +----------------+-------------+--------------------------+-----------+
    | refcount (8 B) | roads (8 B) | 6 road slots (6 x 8 B)   | the bytes |
    +----------------+-------------+--------------------------+-----------+
      how many holders and in-flight handles exist, in all processes
                       how many roads its handles took; which ones (a queue
                       pipe's inode, or -1: a road mpviz cannot name)

* ``create``: ``shm_open(O_CREAT|O_EXCL)``, size it and reserve its pages, map it (every page at
  once: see :mod:`~mpviz.sharing.mapping`), **close the descriptor** (holders keep no fds: that
  is this strategy's advantage), refcount = 1.
* Pickling a storage adds 1 for the handle in flight; the receiver that opens it by name takes
  that reference over. Each holder that lets go (its last NumPy view of the bytes is gone)
  subtracts 1; **whoever brings it to 0 unlinks the name**. Every holder maps the header, so
  the count is changed with one atomic add on the mapped page (``lock xadd`` on x86: atomic.c,
  else ``libatomic`` through ctypes): no system call, two processes never lose an update. Where
  neither is there, an ``fcntl`` lock on the segment does the same job at ~15 µs per update.
* A process killed by SIGKILL never subtracts its 1: the name would stay in /dev/shm until the
  machine reboots. That is the leak the :mod:`~mpviz.sharing.shm_manager` exists for — every holder
  tells it what it holds, and it unlinks what no live process holds and no handle in flight
  names (it reads those from this count, less the counts of the holders it saw die).

* **Which roads its handles took.** Before a handle is counted, its sender notes in the header
  which queue pipe will carry it (:meth:`FsSegment.note_channel`): a slot claimed with one
  atomic add on "roads", then the pipe's inode written in it — once per segment and pipe, so a
  tensor sent again and again on one queue writes nothing more. The manager reads those slots
  for a name no live process holds that still has handles in flight: it keeps the name while a
  live process can still read one of those pipes. A road it cannot see (a ``Pipe``, a
  ``SimpleQueue``, more than 6 roads) is marked -1, and then it keeps the name longer.

* A segment whose count is 1 — ours — is mapped by no other process and named by no handle in
  flight, so the caching allocator (:mod:`~mpviz.sharing.allocator`) may keep it and hand it
  out again instead of unlinking it.

Adapted from torch's ``RefcountedMapAllocator`` (ATen ``MapAllocator.cpp``: a 64-byte header with
an atomic refcount in front of the data) and ``libshm``. Python has no atomics on shared memory,
so the add is a small C function (mpviz/sharing/atomic.c, built on first use), or ``libatomic``'s
``__atomic_fetch_add_8`` called through ctypes where nothing can be compiled.
"""
import ctypes
import errno
import fcntl
import itertools
import os
import secrets
import struct
import threading
import time
import weakref

from ..errors import SegmentGoneError, TooManyFdsError
from ..trace import recorder
from . import allocator, shm_manager
from . import file_descriptor
from .file_descriptor import _fill_and_map, _reserve, atomic_add
from .mapping import map_shared
# The header after the count (see the picture above). The shm manager reads it too, and uses
# only the standard library, so the layout is written down there.
from .shm_manager import ROADS_AT, SLOTS_AT, SLOTS, UNKNOWN_ROAD, roads  # noqa: F401

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

STRATEGY = "file_system"
HEADER = 64
_COUNT = struct.Struct("=q")
_SLOTS = struct.Struct(f"={SLOTS}q")
_TAG = os.environ.get("MPVIZ_SHM_TAG", "")  # a tag lets test runs tell their segments apart
if not all(c.isalnum() or c in "_-." for c in _TAG):
    raise ValueError(
        f"MPVIZ_SHM_TAG={_TAG!r}: it becomes part of every segment's name in /dev/shm, and a "
        f"name may hold only letters, digits and _-. (a '/' is not allowed in it, and the shm "
        f"manager reads names from space-separated lines). Fix: choose a tag such as 'run1_'.")
PREFIX = "/mpviz_" + _TAG

_live = {}  # id -> finalizer of every mapping this process holds (a forked child counts itself in)
_ids = itertools.count()


class FsSegment:
    """A named segment that this process holds one reference to (no descriptor kept open).

    The reference is given back when the last NumPy view of :attr:`array` is gone — not when
    this object is — so that a count of 1 really means "nobody else maps it".
    """

    strategy = STRATEGY

    def __init__(self, name, nbytes, buf, created=False):
        self.name = name
        self.nbytes = nbytes
        self.key = (STRATEGY, name)
        self.created = created         # made here (not received): the allocator may park it
        file_descriptor._choose_atomic_add()  # before any fork: see there
        self._buf = buf
        import numpy as np  # here, not at the top: a spawned child that sends no tensor never needs it
        self.array = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=HEADER)
        self._roads = set()            # roads this mapping has seen written in the header
        token = next(_ids)
        self._finalizer = weakref.finalize(self.array, _let_go, token, name, nbytes, buf, created)
        _live[token] = self._finalizer

    def note_channel(self, channel):
        """Note in the header that a handle travels in the queue pipe whose inode is `channel`
        (None: a road mpviz cannot name). Costs a set lookup when this road is known already."""
        road = UNKNOWN_ROAD if channel is None else channel
        if road in self._roads:
            return
        self._roads.add(road)
        if road in _SLOTS.unpack_from(self._buf, SLOTS_AT):
            return                     # another process wrote it
        slot = _claim_road(self.name, self._buf)
        if slot < SLOTS:               # past the last slot the count of roads says "more"
            _COUNT.pack_into(self._buf, SLOTS_AT + 8 * slot, road)

    def incref(self):
        """Count one more holder or handle in flight (we map the header: no need to open the name)."""
        return _add_mapped(self.name, self._buf, +1)

    def decref(self):
        """Count one fewer; unlink the name if that was the last. Returns the new count."""
        return _add_mapped(self.name, self._buf, -1)


def _let_go(token, name, nbytes, buf, created):
    _live.pop(token, None)
    if created:
        if allocator.park(_Parked(name, nbytes, buf)):
            return  # the allocator keeps our reference (and the name) to hand it out again
    elif allocator.enabled():
        # received: count ourselves out now (the producer may reuse it), and keep the mapping
        # while someone else still counts it (see file_descriptor, and the allocator). We still
        # map it, so the manager keeps hearing that we hold it, until the cache lets it go; but
        # our count is gone, and it must know that before it is (or it would think a handle in
        # flight is ours, and keep the name for ever if we are killed meanwhile).
        if recorder.ENABLED:
            recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)
        manager = shm_manager.client()
        manager.change(name, counted=-1, uncounted=+1)   # before the count goes: see _release
        if _add_mapped(name, buf, -1) > 0 and allocator.keep_received(_Kept(name, nbytes, buf)):
            if recorder.ENABLED:
                recorder.emit("shm.cache", kept=True, name=name, strategy=STRATEGY, nbytes=nbytes)
            return
        manager.change(name, uncounted=-1)
        return  # not kept: the mapping goes with buf
    _release(name, nbytes, buf)


def _release(name, nbytes, buf):
    if recorder.ENABLED:
        recorder.emit("shm.detach", name=name, strategy=STRATEGY, nbytes=nbytes)
    # The manager hears that our count is going *before* it goes: killed in between, we would
    # leave it a count it thinks is ours (it keeps the name longer), never one it thinks is
    # ours and is not (it would remove a name whose handle is still in a queue).
    manager = shm_manager.client()
    manager.change(name, counted=-1, uncounted=+1)
    _add_mapped(name, buf, -1)
    manager.change(name, uncounted=-1)


class _Parked:
    """A segment nobody here uses any more, kept by the allocator with our reference still counted."""

    strategy = STRATEGY

    def __init__(self, name, nbytes, buf):
        self.name, self.nbytes, self.buf = name, nbytes, buf

    def sole_holder(self):
        """True when the count is 1 — ours: no other process maps it, no handle names it."""
        return _add_mapped(self.name, self.buf, 0) == 1

    def revive(self):
        # Only we count it (sole_holder): no handle of its old life is on its way, so the roads
        # those took are history. Forget them, or they would fill the slots over many reuses.
        self.buf[ROADS_AT:HEADER] = bytes(HEADER - ROADS_AT)
        return FsSegment(self.name, self.nbytes, self.buf, created=True)

    def free(self):
        _release(self.name, self.nbytes, self.buf)

    def forget(self):
        """In a forked child: the parent's reference, not ours. Say nothing."""


class _Kept:
    """A received segment nobody here uses any more, kept mapped with our reference given back,
    in case the same memory arrives again (see the allocator)."""

    strategy = STRATEGY

    def __init__(self, name, nbytes, buf):
        self.name, self.nbytes, self.buf = name, nbytes, buf
        self.key = (STRATEGY, name)

    def orphaned(self):
        """True when no other process counts this memory (its name is gone, or about to be)."""
        count = atomic_add(self.buf, 0)
        if count is None:               # no atomics here: ask by name
            try:
                count = _add(self.name, 0)
            except FileNotFoundError:
                return True
        return count <= 0

    def revive(self):
        """Ours again: the arriving handle's reference becomes ours, as in :func:`attach`."""
        shm_manager.client().change(self.name, counted=+1, uncounted=-1)  # ours again
        if recorder.ENABLED:
            recorder.emit("shm.attach", name=self.name, strategy=STRATEGY, nbytes=self.nbytes,
                          kept=True)
        return FsSegment(self.name, self.nbytes, self.buf)

    def free(self):
        """The count was given back when it was kept; tell the manager, and the mapping goes
        when buf does."""
        shm_manager.client().change(self.name, uncounted=-1)

    def forget(self):
        """In a forked child: the parent's hold, not ours. Say nothing."""


def create(nbytes, data=None):
    """Make a new named segment of `nbytes` bytes, held once by this process, filled with `data`
    (a C-contiguous array of `nbytes` bytes) if given."""
    name = PREFIX + secrets.token_hex(10)
    manager = shm_manager.client()
    manager.change(name, counted=+1)  # first: if we die right after, it still knows
    try:
        fd = _open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    except BaseException:
        manager.change(name, counted=-1)
        raise
    try:
        _reserve(fd, HEADER + max(nbytes, 1), STRATEGY)
        buf = _fill_and_map(fd, nbytes, data)
    except BaseException:
        os.close(fd)
        _posixshmem.shm_unlink(name)
        manager.change(name, counted=-1)
        raise
    os.close(fd)  # holders keep no descriptor: the mapping is enough
    _COUNT.pack_into(buf, 0, 1)
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return FsSegment(name, nbytes, buf, created=True)


def attach(name, nbytes):
    """Map the segment `name`, taking over one reference that the sender counted for us."""
    manager = shm_manager.client()
    manager.change(name, counted=+1)  # first: the handle's count is ours from here on
    try:
        fd = _open(name, os.O_RDWR)
    except FileNotFoundError:
        manager.change(name, counted=-1)
        raise SegmentGoneError(name) from None
    try:
        buf = map_shared(fd, HEADER + max(nbytes, 1))
    finally:
        os.close(fd)
    if recorder.ENABLED:
        recorder.emit("shm.attach", name=name, strategy=STRATEGY, nbytes=nbytes)
    return FsSegment(name, nbytes, buf)


def incref(name):
    """Count one more holder or in-flight handle of `name`, by name; return the new count.

    (A holder uses ``segment.incref()`` instead: it maps the header already.)"""
    return _add(name, +1)


def decref(name):
    """Count one holder fewer, by name; unlink the name when nobody is left. Return the new count."""
    return _add(name, -1)


def refcount(name):
    """The current count of `name` (for pictures and tests); None if the name is gone."""
    try:
        return _add(name, 0)
    except FileNotFoundError:
        return None


def _add_mapped(name, buf, delta):
    """Change the count through our own mapping of the header: one atomic add, no system call."""
    count = atomic_add(buf, delta)
    if count is None:
        return _add(name, delta)  # no atomics here: the locked path by name
    if count <= 0 and delta < 0:
        _unlink(name)
    return count


def _claim_road(name, buf):
    """Claim the next road slot of the header (an atomic add on its count of roads); its index."""
    roads = (ctypes.c_char * 8).from_buffer(buf, ROADS_AT)
    n = atomic_add(roads, 1)
    if n is None:                      # no atomics here: an fcntl lock on those 8 bytes
        fd = _open(name, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 8, ROADS_AT)
            n = _COUNT.unpack_from(buf, ROADS_AT)[0] + 1
            _COUNT.pack_into(buf, ROADS_AT, n)
        finally:
            os.close(fd)
    return n - 1


def _add(name, delta):
    """Change the count of a segment we may not map (by name: open it, map its header, add)."""
    try:
        fd = _open(name, os.O_RDWR)
    except FileNotFoundError:
        if delta == 0:
            raise
        return 0  # already unlinked (by the manager, or by hand): nothing left to count
    try:
        header = map_shared(fd, HEADER)
        count = atomic_add(header, delta)
        if count is None:  # no atomics here: an fcntl lock on the count while we update it
            fcntl.lockf(fd, fcntl.LOCK_EX, _COUNT.size, 0)
            count = _COUNT.unpack_from(header, 0)[0] + delta
            _COUNT.pack_into(header, 0, count)
        if count <= 0 and delta < 0:
            _unlink(name)
    finally:
        os.close(fd)  # also drops the lock
    return count


def _unlink(name):
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        return  # the manager (or a user) got there first
    shm_manager.client().unlinked(name)
    if recorder.ENABLED:
        recorder.emit("shm.unlink", name=name, strategy=STRATEGY, by="refcount")


def _open(name, flags):
    try:
        return _posixshmem.shm_open(name, flags, 0o600)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise TooManyFdsError(f"opening shared memory {name}") from None
        raise


def _count_inherited_after_fork():
    # A forked child maps every segment its parent mapped: count it as a holder, or the first of
    # the two to let go would unlink the other's name (or the allocator reuse what it still sees).
    for finalizer in list(_live.values()):
        info = finalizer.peek()
        if info is None:
            continue
        _, name, _, buf, _ = info[2]
        try:
            _add_mapped(name, buf, +1)  # (then the manager: killed in between, it keeps the name)
            shm_manager.client().change(name, counted=+1)
        except OSError:
            pass


os.register_at_fork(after_in_child=_count_inherited_after_fork)


# -- a process keeps what it received and sent on, for a moment ---------------------------------
#
# A consumer that sends a tensor back and drops it (``q_out.put(q_in.get())``) would unmap the
# segment at once, and map it again (shm_open + mmap + a manager message) when the same memory
# arrives next time, maybe 100 µs later. So a process keeps every storage it *received and sends
# on* for another LINGER_SECONDS to 2 x LINGER_SECONDS after the last send, as the fd server keeps
# its offers: a handle to it that arrives meanwhile finds that very Storage in the receive cache,
# and maps and builds nothing. Segments it created are not kept: when their last tensor goes,
# the caching allocator may reuse them at once (see mpviz.sharing.allocator).
#
# The counts stay true, because the segment really stays mapped: this process still counts as a
# holder until it lets go, a few ms later. That is also why nothing lingers while the cache
# for fresh tensors is on: it keeps received mappings itself, with us counted out, so the sender
# can reuse its segment for its next tensor. (file_descriptor does the like: the fd server keeps
# what it offered until the receiver fetches it, or until its release arrives, which a receiver
# sends up to fd_passing.RELEASE_DELAY after it unpickled.)

LINGER_SECONDS = 0.005


class _Linger:
    """Storages just sent, in two generations that a thread ages every LINGER_SECONDS::

        keep(s):  young[name] = s            one dict store: no lock, no clock (it runs per put)
        tick:     let go of old; old = young; young = {}

    A storage sent again before it ages out is in young again, so it stays; one that is not is
    let go between one and two ticks after its last send. The cost is the thread's: while
    anything lingers it wakes every LINGER_SECONDS (200 times a second), and sleeps once
    nothing does.
    """

    def __init__(self):
        self.young, self.old = {}, {}
        self.idle = True               # the thread sleeps until the next keep()
        self.wake = threading.Event()
        self.lock = threading.Lock()   # only to start the one thread, or wake it
        self.thread = None

    def keep(self, storage):
        self.young[storage._segment.name] = storage
        if self.idle:                  # rare: the first keep, or the first after a quiet spell
            with self.lock:
                if self.thread is None:
                    self.thread = threading.Thread(target=self._tick, name="mpviz-fs-linger",
                                                   daemon=True)
                    self.thread.start()
                self.idle = False
                self.wake.set()

    def _tick(self):
        while True:
            self.wake.wait()
            time.sleep(LINGER_SECONDS)
            self.old, self.young = self.young, {}   # the old old goes: its storages let go
            if not self.old and not self.young:
                self.wake.clear()      # nothing left to age: sleep until keep() says so
                self.idle = True
                if self.young:         # a keep() came in between: it may not have woken us
                    self.idle = False
                    self.wake.set()


_linger = _Linger()


def keep_after_send(storage):
    """`storage` was just sent: keep it (and so its segment) a few ms more, if it was received
    here and the cache for fresh tensors is off (see above)."""
    if not storage._segment.created and not allocator.enabled():
        _linger.keep(storage)


def _forget_linger_after_fork():
    # A child keeps nothing for its parent's sends. Registered after the counting-in above, so
    # the references dropped here were counted for this child first.
    global _linger
    old, _linger = _linger, _Linger()
    old.young.clear()
    old.old.clear()


os.register_at_fork(after_in_child=_forget_linger_after_fork)


# multiprocessing's fork and forkserver children end with os._exit(), which skips atexit, and so
# skips the weakref finalizers that give our references back. Their bootstrap does run
# multiprocessing's own exit finalizers: hook the release in there.
class _ChildExitHook:
    def __call__(self, _):
        from multiprocessing import util
        util.Finalize(None, _release_all, exitpriority=-100)


def _release_all():
    allocator.close()  # from here on nothing is kept for reuse; what was kept is given back
    for finalizer in list(_live.values()):
        finalizer()
    file_descriptor.release_all()


_hook = _ChildExitHook()


def _register_child_exit_hook():
    from multiprocessing import util
    util.register_after_fork(_hook, _hook)


_register_child_exit_hook()
