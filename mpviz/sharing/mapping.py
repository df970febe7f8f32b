"""Map a shared-memory descriptor into this process — without keeping a second descriptor open.

Python's ``mmap.mmap(fd, n)`` quietly ``dup()``s the descriptor and keeps the copy for as long
as the map lives. That would double the descriptors the ``file_descriptor`` strategy holds, and
give ``file_system`` holders descriptors it promises they don't have. So mpviz calls the C
library's ``mmap(2)`` itself (Python 3.13 added ``mmap(..., trackfd=False)`` for this)::

    ptr = mmap(NULL, n, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0)
    buf = (c_char * n).from_address(ptr)        a buffer NumPy can view
    weakref.finalize(buf, munmap, ptr, n)       unmapped when the last view of it is gone

The caller may close `fd` straight away: a mapping does not need its descriptor.

**A new segment's bytes go in by write(2), in one pass** (:func:`write_into`). Mapping a new
tmpfs file and copying into the mapping costs two passes: the first touch of each page makes
the kernel zero it (a page fault per 4 KiB page, or one ``madvise(MADV_POPULATE_WRITE)`` for all
of them), then the copy overwrites it. A page that ``write(2)`` fills whole is not zeroed::

    map, copy:   mmap ─▶ fault: zero a page ─▶ copy ─▶ fault ─▶ ...     (torch)
    write, map:  pwrite(fd, bytes, 64) ─▶ mmap                      (pages filled, then mapped)

Each process maps the pages at its first touch (a minor fault: nothing is zeroed). With no bytes
to write, ``populate=True`` maps every page in one ``MADV_POPULATE_WRITE``. A /dev/shm mounted
``huge=within_size`` gets 2 MiB pages from the same write, with no change here. Measurements:
docs/PERFORMANCE.md, "A fresh tensor's put".
"""
import ctypes
import errno
import mmap
import os
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_MAP_FAILED = ctypes.c_void_p(-1).value

MADV_POPULATE_WRITE = 23  # from <linux/mman.h>, Linux 5.14 and later
POPULATE_FROM = 64 << 10  # below this a segment is a few pages: faulting them costs less than a call
_populate_works = None    # None: not tried yet in this process; then True or False


def map_shared(fd, size, populate=False, unmap_at_exit=True):
    """A writable buffer of `size` bytes mapping `fd` (MAP_SHARED); unmapped when collected.

    `populate`: map every page now, in one system call (for a new segment about to be filled).
    `unmap_at_exit=False`: not unmapped by interpreter shutdown either. Python runs pending
    ``weakref.finalize`` callbacks at exit, which would unmap the buffer *before* an exit hook
    that still writes to it (the CUDA simulator's: it frees blocks and gives counts back). The
    kernel unmaps everything when the process ends anyway.
    """
    ptr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if ptr is None or ptr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    buf = (ctypes.c_char * size).from_address(ptr)
    weakref.finalize(buf, _libc.munmap, ptr, size).atexit = unmap_at_exit
    if populate and size >= POPULATE_FROM:
        prefault(ptr, size)
    return buf


def write_into(fd, data, offset):
    """Write the bytes of `data` (a C-contiguous NumPy array) into the file `fd` at `offset`.

    For a new tmpfs segment this is one pass over memory: the kernel copies each page of `data`
    into a new page of the file, and does not zero a page the write fills (it zeroes only the
    parts a write leaves, here the header's first 64 bytes). The alternative, map the file and
    copy into the mapping, makes the kernel zero every page first, then copies: two passes.
    The write also allocates each page it fills (nothing reserved them before): where /dev/shm
    is full it stops short, and this raises ``OSError`` ENOSPC (the caller says what to do).
    """
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):      # one write(2) moves at most ~2 GiB: go on where it stopped
        n = os.pwrite(fd, view[done:], offset + done)
        if n == 0:
            raise OSError(errno.ENOSPC, f"write into shared memory stopped at {done} of "
                                        f"{len(view)} bytes")
        done += n


def prefault(ptr, size):
    """Fault in the `size` bytes mapped at `ptr` for writing, in one call; True if it was done.

    Only a speed-up: the caller has already reserved the pages (``posix_fallocate``, or the
    write that filled them), so where this is not available the copy simply faults the pages
    in one by one, as before.
    """
    global _populate_works
    if _populate_works is False:
        return False
    if _libc.madvise(ptr, size, MADV_POPULATE_WRITE) == 0:
        _populate_works = True
        return True
    err = ctypes.get_errno()
    if err == errno.EINVAL and _populate_works is None:
        # a kernel older than 5.14 does not know the advice: stop asking, in this process
        _populate_works = False
    # any other error (EFAULT, ENOMEM: memory tight right now) leaves the pages to the copy,
    # which meets the same condition the ordinary way
    return False


def populate_supported():
    """True where this kernel takes ``MADV_POPULATE_WRITE`` (tried on one private page)."""
    m = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        return _libc.madvise(ptr, mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
    finally:
        m.close()


__all__ = ["map_shared", "write_into", "prefault", "populate_supported"]
