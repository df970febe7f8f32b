"""Map a shared-memory descriptor into this process — without keeping a second descriptor open.

Python's ``mmap.mmap(fd, n)`` quietly ``dup()``s the descriptor and keeps the copy for as long
as the map lives. That would double the descriptors the ``file_descriptor`` strategy holds, and
give ``file_system`` holders descriptors it promises they don't have. So mpviz calls the C
library's ``mmap(2)`` itself (Python 3.13 added ``mmap(..., trackfd=False)`` for this)::

    ptr = mmap(NULL, n, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0)
    buf = (c_char * n).from_address(ptr)        a buffer NumPy can view
    weakref.finalize(buf, munmap, ptr, n)       unmapped when the last view of it is gone

The caller may close `fd` straight away: a mapping does not need its descriptor.
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
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_shared(fd, size):
    """A writable buffer of `size` bytes mapping `fd` (MAP_SHARED); unmapped when collected."""
    ptr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if ptr is None or ptr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    buf = (ctypes.c_char * size).from_address(ptr)
    weakref.finalize(buf, _libc.munmap, ptr, size)
    return buf


__all__ = ["map_shared", "errno"]
