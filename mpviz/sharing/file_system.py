"""The ``file_system`` strategy: named segments in /dev/shm, handed over by name, reference counted.

How it works: a segment is a file ``/dev/shm/mpviz_3f9c…`` (mode 0600), a 64-byte header and
then the bytes. The header holds the refcount (how many holders and in-flight handles exist, in
all processes), then which channels its handles took, for the shm manager (the layout is
defined, and drawn, in :mod:`~mpviz.sharing.shm_manager`, which reads it).

* ``create``: tell the shm manager, ``shm_open(O_CREAT|O_EXCL)``, size it, write the bytes in
  (the write allocates the pages) and map it (see :mod:`~mpviz.sharing.segment`), **close the
  descriptor** (holders keep no fds: that is this strategy's advantage), refcount = 1.
* Pickling a storage adds 1 for the handle in flight; the receiver that opens it by name takes
  that reference over. Each holder that lets go (its last NumPy view of the bytes is gone)
  subtracts 1; **whoever brings it to 0 unlinks the name**. Every holder maps the header, so
  the count is changed with one atomic add on the mapped page (see segment.py).
* A process killed by SIGKILL never subtracts its 1: the name would stay in /dev/shm until the
  machine reboots: the leak the :mod:`~mpviz.sharing.shm_manager` exists for. Every holder tells
  it what it holds; it unlinks what no live process holds and no handle in flight names.

Adapted from torch's ``RefcountedMapAllocator`` (ATen ``MapAllocator.cpp``: a 64-byte header with
an atomic refcount in front of the data) and ``libshm``.
"""
import ctypes
import errno
import os
import secrets
import struct
import threading
import time

from ..errors import SegmentGoneError, TooManyFdsError
from ..trace import recorder
from . import allocator, shm_manager
from .mapping import map_shared
from .segment import HEADER, Hold, Segment, add_at, atomic_add, fill_and_map, fills_every_page, reserve
# The header after the count: defined and drawn in shm_manager.py (which reads it too, with the
# standard library only).
from .shm_manager import CHANNELS_AT, SLOTS_AT, SLOTS, UNKNOWN_CHANNEL, channels  # noqa: F401
from .shm_manager import RELEASE, split_count

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

STRATEGY = "file_system"
_COUNT = struct.Struct("=q")
_SLOTS = struct.Struct(f"={SLOTS}q")
_TAG = os.environ.get("MPVIZ_SHM_TAG", "")  # a tag lets test runs tell their segments apart
if not all(c.isalnum() or c in "_-." for c in _TAG):
    raise ValueError(
        f"MPVIZ_SHM_TAG={_TAG!r}: it becomes part of every segment's name in /dev/shm, and a "
        f"name may hold only letters, digits and _-. (a '/' is not allowed in it, and the shm "
        f"manager reads names from space-separated lines). Fix: choose a tag such as 'run1_'.")
PREFIX = "/mpviz_" + _TAG


class FsHold(Hold):
    """This process's hold: the mapping, and one reference counted in the header (no descriptor).

    The shm manager hears of a count we take before we take it: killed in between, we leave it
    a count it thinks is ours (it keeps the name longer), never one it thinks is ours and is
    not (it would remove a name whose handle is still in a queue). A count we give back is said
    before (``LETGO``) and after (the new number): killed in between, we leave it in doubt, and
    the header's count of releases, which our give-back adds to, tells it which."""

    strategy = STRATEGY

    def __init__(self, name, nbytes, buf, created=False):
        super().__init__(name, nbytes, buf, (STRATEGY, name), created)

    def add(self, delta):
        return _add_mapped(self.name, self.buf, delta)

    def counting_out(self):
        shm_manager.client().letting_go(self.name)

    def give_back(self):
        return _add_mapped(self.name, self.buf, -1, release=True)

    def counted_out(self, kept=False):
        shm_manager.client().change(self.name, counted=-1, uncounted=+1 if kept else 0)

    def dropped(self):
        shm_manager.client().change(self.name, uncounted=-1)

    def counted_in(self, kept=False):
        if kept:
            shm_manager.client().change(self.name, counted=+1, uncounted=-1)
        else:
            shm_manager.client().change(self.name, counted=+1)

    def orphaned(self):
        word = atomic_add(self.buf, 0)
        if word is None:                # no atomics here: ask by name
            try:
                count = _add(self.name, 0)
            except FileNotFoundError:
                return True             # its name is gone
        else:
            count = split_count(word)[0]
        return count <= 0

    def reused(self):
        # Only we count it (sole_holder): no handle of its old life is on its way, so the channels
        # those took are history. Forget them, or they would fill the slots over many reuses.
        self.buf[CHANNELS_AT:HEADER] = bytes(HEADER - CHANNELS_AT)


class FsSegment(Segment):
    """A named segment that this process holds one reference to (no descriptor kept open).

    A segment whose count is 1 — ours — is mapped by no other process and named by no handle in
    flight, so the caching allocator (:mod:`~mpviz.sharing.allocator`) may keep it and hand it
    out again instead of unlinking it. The shm manager reads the handles in flight from this
    count, less the counts of the holders it saw die."""

    def __init__(self, hold):
        super().__init__(hold)
        self._channels = set()         # channels this mapping has seen written in the header

    def note_channel(self, channel):
        """Note in the header that a handle travels in the queue pipe whose inode is `channel`
        (None: a channel mpviz cannot name). Costs a set lookup when this channel is known.

        This is how the shm manager knows which channels a name's handles took. Before a handle
        is counted, its sender notes in the header which queue pipe will carry it: a slot claimed
        with one atomic add on "channels", then the pipe's inode written in it — once per segment
        and pipe, so a tensor sent again and again on one queue writes nothing more. The manager
        reads those slots for a name no live process holds that still has handles in flight: it
        keeps the name while a live process can still read one of those pipes. A channel it
        cannot see (a ``Pipe``, a ``SimpleQueue``, more than 6 channels) is marked -1, and then
        it keeps the name longer."""
        channel = UNKNOWN_CHANNEL if channel is None else channel
        if channel in self._channels:
            return
        self._channels.add(channel)
        if channel in _SLOTS.unpack_from(self._buf, SLOTS_AT):
            return                     # another process wrote it
        slot = _claim_channel_slot(self.name, self._buf)
        if slot < SLOTS:               # past the last slot the count of channels says "more"
            _COUNT.pack_into(self._buf, SLOTS_AT + 8 * slot, channel)


FsHold.segment_class = FsSegment


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
        reserve(fd, HEADER + max(nbytes, 1), STRATEGY, written=fills_every_page(nbytes, data))
        buf = fill_and_map(fd, nbytes, data, STRATEGY)
    except BaseException:
        os.close(fd)
        _posixshmem.shm_unlink(name)
        manager.change(name, counted=-1)
        raise
    os.close(fd)  # holders keep no descriptor: the mapping is enough
    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy=STRATEGY, nbytes=nbytes)
    return FsSegment(FsHold(name, nbytes, buf, created=True))


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
    return FsSegment(FsHold(name, nbytes, buf))


def refcount(name):
    """The current count of `name` (for pictures and tests); None if the name is gone."""
    try:
        return _add(name, 0)
    except FileNotFoundError:
        return None


def _add_mapped(name, buf, delta, release=False):
    """Change the count through our own mapping of the header: one atomic add, no system call.
    `release`: a holder gives its count back (`delta` -1), the releases counted with it. The
    new count."""
    word = atomic_add(buf, RELEASE if release else delta)
    if word is None:
        return _add(name, delta, release)  # no atomics here: the locked path by name
    count = split_count(word)[0]
    if count <= 0 and delta < 0:
        _unlink(name)
    return count


def _claim_channel_slot(name, buf):
    """Claim the next channel slot of the header (an atomic add on its count of channels); its
    index."""
    n = atomic_add((ctypes.c_char * 8).from_buffer(buf, CHANNELS_AT), 1)
    if n is None:                      # no atomics here: the locked add needs a descriptor
        fd = _open(name, os.O_RDWR)
        try:
            n = add_at(buf, fd, 1, CHANNELS_AT)
        finally:
            os.close(fd)
    return n - 1


def _add(name, delta, release=False):
    """Change the count of a segment we may not map (by name: open it, map its header, add)."""
    try:
        fd = _open(name, os.O_RDWR)
    except FileNotFoundError:
        if delta == 0:
            raise
        return 0  # already unlinked (by the manager, or by hand): nothing left to count
    try:
        count = split_count(add_at(map_shared(fd, HEADER), fd, RELEASE if release else delta))[0]
        if count <= 0 and delta < 0:
            _unlink(name)
    finally:
        os.close(fd)
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
    # A child keeps nothing for its parent's sends. Registered after segment.py's counting-in
    # (_count_inherited_after_fork: segment.py is imported first, at the top of this file), so
    # the references dropped here were counted for this child first.
    global _linger
    old, _linger = _linger, _Linger()
    old.young.clear()
    old.old.clear()


os.register_at_fork(after_in_child=_forget_linger_after_fork)
