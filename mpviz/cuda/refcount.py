"""The reference counters: one small shared file of int64 slots per producer process.

A CUDA block cannot count its own users: device memory has no header the OS could lock, and the
consumers are other processes. So the producer keeps a separate, ordinary shared-memory file of
counters, one slot per block it has sent, and sends ``(file name, slot)`` along with each handle::

    producer (pid 41)                              /dev/shm/mpviz_cudarc_41_9f3a…
    block A ─ slot 0 ─────────────────────────▶   [ 2 | 0 | 1 | 0 | 0 | … ]  1024 x int64
    block B ─ slot 2 ─────────────────────────▶         ▲       ▲
                                                        │       │  consumers add / subtract
    consumer 57 holds A ───── -1 when it lets go ───────┘       │  under an fcntl lock on
    consumer 58 holds A and B ─ -1 each when it lets go ────────┘  just that slot's 8 bytes

A slot counts **handles in flight plus processes holding the block**:

* the producer adds 1 each time it pickles a handle (``Queue.put``);
* a consumer that opens the handle keeps that 1 until its tensor dies, then subtracts it; a
  consumer that already holds the block (receive cache hit) subtracts it at once;
* the producer may free the block only when the slot reads 0. Until then a block the producer's
  own code let go of waits in *limbo* (:mod:`mpviz.cuda.ipc`).

Adapted from torch's ``CudaIPCRefCountersFile`` (``torch/csrc/CudaIPCTypes.cpp``). Simplified
(details: :class:`CounterFile`, :func:`add`): 1024 slots, an ``fcntl`` lock, a count per handle.
"""
import errno
import fcntl
import os
import secrets
import struct


from ..sharing import file_system, shm_manager
from ..sharing.mapping import map_shared as _map_shared
from ..trace import recorder

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

def map_shared(fd, size):
    """:func:`mpviz.sharing.mapping.map_shared`, never unmapped by interpreter shutdown (the
    exit hook that frees blocks and gives counts back still writes to it)."""
    return _map_shared(fd, size, unmap_at_exit=False)


SLOTS = 1024
SLOT = struct.Struct("=q")
PREFIX = file_system.PREFIX + "cudarc_"


class CounterFile:
    """A producer's file of SLOTS counters. The producer hands out slots; anyone may update them.

    torch's ``CudaIPCRefCountersFile`` (``torch/csrc/CudaIPCTypes.cpp``): files named
    ``/torch_<pid>_<rand>`` of ``CUDA_IPC_REF_COUNTER_FILE_SIZE`` = 10000 int64 slots, a new file
    when one is full. Simplified here: 1024 slots. torch sets a slot to 1 per sent block and
    relies on the receive-side cache, mpviz counts each handle."""

    def __init__(self):
        self.name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        shm_manager.client().hold(self.name)  # if we are SIGKILLed, the manager removes the file
        fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, SLOTS * SLOT.size)  # a new file reads as zeros
            self.buf = map_shared(fd, SLOTS * SLOT.size)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(self.name)
            raise
        os.close(fd)
        _mapped[self.name] = self.buf  # add() and read() use the producer's own mapping
        self.free = list(range(SLOTS - 1, -1, -1))
        self.unlinked = False
        if recorder.ENABLED:
            recorder.emit("shm.create", name=self.name, strategy="cuda_refcount", nbytes=SLOTS * SLOT.size)

    def take(self):
        """A slot (set to 0) for a newly sent block, or None when the file is full."""
        if not self.free:
            return None
        slot = self.free.pop()
        SLOT.pack_into(self.buf, slot * SLOT.size, 0)
        return slot

    def give_back(self, slot):
        self.free.append(slot)

    def in_use(self):
        return SLOTS - len(self.free)

    def unlink(self):
        """Remove the name (when no slot is in use, or at exit). Mappings stay valid."""
        if self.unlinked:
            return
        self.unlinked = True
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass
        shm_manager.client().unlinked(self.name)
        shm_manager.client().drop(self.name)
        if recorder.ENABLED:
            recorder.emit("shm.unlink", name=self.name, strategy="cuda_refcount", by="producer")


# -- anyone: read and update a slot --------------------------------------------------------------

_mapped = {}  # counter file name -> this process's mapping of it (consumers map each file once)


def mapping(name):
    """This process's mapping of counter file `name` (mapped on first use)."""
    found = _mapped.get(name)
    if found is None:
        fd = _posixshmem.shm_open(name, os.O_RDWR, 0o600)  # FileNotFoundError: producer gone
        try:
            found = _mapped[name] = map_shared(fd, SLOTS * SLOT.size)
        finally:
            os.close(fd)
    return found


def read(name, slot):
    """The current count (an aligned 8-byte read: no lock needed to look)."""
    return SLOT.unpack_from(mapping(name), slot * SLOT.size)[0]


def add(name, slot, delta):
    """Add `delta` to the slot under a lock on its 8 bytes; return the new count.

    Returns None if this process never mapped the file and its producer has removed it (then
    there is nothing left to count).

    Every update opens the file by name, locks the slot, reads, writes and closes: no process keeps
    a descriptor. A consumer that finds the name gone (its producer has exited and unlinked it)
    updates its own mapping without a lock — nobody is left to race with.

    An ``fcntl`` lock on the slot per update instead of torch's atomic add (mpviz's shm segments
    count with one, sharing/atomic.c; a slot changes only once per handle, and a lock on its 8
    bytes is the plainest correct update to read)."""
    try:
        buf = mapping(name)
    except FileNotFoundError:
        return None
    offset = slot * SLOT.size
    try:
        fd = _posixshmem.shm_open(name, os.O_RDWR, 0o600)
    except FileNotFoundError:
        fd = None  # the producer has exited and removed the file: nobody left to race with
    except OSError as e:  # pragma: no cover - out of descriptors
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        fd = None
    try:
        if fd is not None:
            fcntl.lockf(fd, fcntl.LOCK_EX, SLOT.size, offset)
        count = SLOT.unpack_from(buf, offset)[0] + delta
        SLOT.pack_into(buf, offset, count)
    finally:
        if fd is not None:
            os.close(fd)  # also drops the lock
    return count


def forget_all():
    """Drop this process's mappings of other producers' files (after fork, at exit)."""
    _mapped.clear()
