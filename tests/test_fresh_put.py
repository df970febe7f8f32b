"""A fresh tensor's put: its new segment's pages are mapped in one call before the copy, and the
bytes arrive intact at every size, under both strategies."""
import hashlib

import numpy as np
import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz import sharing
from mpviz.sharing import mapping

from proc_helpers import finish, start

pytestmark = pytest.mark.timeout(120)

SIZES = [4 << 10, 1 << 20, 64 << 20, 256 << 20]
needs_populate = pytest.mark.skipif(not mapping.populate_supported(),
                                    reason="this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): "
                                           "the copy faults the pages in one by one, as before")


def _rss_kib(address):
    """Resident KiB of the mapping that starts at `address`, from /proc/self/smaps (the kernel's
    count of this process's mapped pages there: a page not yet faulted in is not counted)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == address
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping starts at {address:#x}")


@needs_populate
@pytest.mark.parametrize("nbytes", [1 << 20, 64 << 20])
def test_a_new_segment_is_mapped_before_the_copy(strategy, nbytes):
    segment = sharing.allocate(nbytes, strategy)
    start_of_map = segment.array.ctypes.data - (segment.array.ctypes.data % 4096)
    assert _rss_kib(start_of_map) * 1024 >= nbytes   # every page in, nothing written yet
    del segment


@needs_populate
def test_without_the_populate_call_the_pages_come_in_only_when_written(strategy, monkeypatch):
    # the control: the same segment made the old way has no page mapped until the copy
    monkeypatch.setattr(mapping, "PREFAULT", False)
    segment = sharing.allocate(1 << 20, strategy)
    start_of_map = segment.array.ctypes.data - (segment.array.ctypes.data % 4096)
    assert _rss_kib(start_of_map) <= 8               # the 64-byte header's page, at most
    segment.array[:] = 1
    assert _rss_kib(start_of_map) * 1024 >= 1 << 20
    del segment


def test_populate_on_memory_that_is_not_mapped_is_refused_quietly():
    # madvise answers ENOMEM for a range nothing maps: prefault says False instead of raising
    # (the caller's copy then faults pages the ordinary way), and it will still try next time
    import mmap
    size = mmap.PAGESIZE
    ptr = mapping._libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                             mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert mapping._libc.munmap(ptr, size) == 0          # the address is now mapped by nothing
    assert mapping.prefault(ptr, size) is False
    assert mapping._populate_works is not False or not mapping.populate_supported()


def _digest(q, out):
    t = q.get()
    out.put((t.numel(), hashlib.blake2b(t.numpy().tobytes(), digest_size=16).hexdigest()))
    del t


@pytest.mark.parametrize("nbytes", SIZES, ids=["4KiB", "1MiB", "64MiB", "256MiB"])
def test_a_fresh_tensor_arrives_intact(strategy, nbytes):
    ctx = mp.get_context("fork")
    values = np.arange(nbytes, dtype=np.uint8) * np.uint8(7) + np.uint8(3)   # no page alike
    t = mpviz.from_numpy(values.view(np.float32))
    want = hashlib.blake2b(values.tobytes(), digest_size=16).hexdigest()
    q, out = ctx.Queue(), ctx.Queue()
    p = start(ctx, _digest, q, out)
    q.put(t)                                   # the put moves it into a new segment
    assert out.get(timeout=60) == (nbytes // 4, want)
    finish(p)
    assert t.is_shared() and t.untyped_storage().location == strategy
    assert np.array_equal(t.numpy().view(np.uint8), values)
    q.close(), out.close()
