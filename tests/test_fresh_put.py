"""A fresh tensor's put: its new segment's pages are mapped in one call before the copy, and the
bytes arrive intact at every size, under both strategies."""
import hashlib
import json
import os

import numpy as np
import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz import sharing
from mpviz.sharing import mapping

from proc_helpers import finish, run_with_small_dev_shm, start

pytestmark = pytest.mark.timeout(120)

SIZES = [4 << 10, 1 << 20, 64 << 20, 256 << 20]
needs_populate = pytest.mark.skipif(not mapping.populate_supported(),
                                    reason="this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): "
                                           "the copy faults the pages in one by one, as before")


def _smaps_kib(address, fields=("Rss:",)):
    """KiB of the first of `fields` that /proc/self/smaps gives for the mapping that starts at
    `address` (0 if it has none of them). "Rss:": the kernel's count of this process's mapped
    pages there (a page not yet faulted in is not counted); "FilePmdMapped:": of those, the KiB
    mapped by 2 MiB pages."""
    found = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                if found:
                    break
                found = int(head.split("-")[0], 16) == address
            elif found and head in fields:
                return int(line.split()[1])
    if not found:
        raise AssertionError(f"no mapping starts at {address:#x}")
    return 0


def _rss_kib(address):
    return _smaps_kib(address)


# MADV_POPULATE_WRITE maps every page, but the kernel may take a page's mapping back at any time
# afterwards (a later touch maps it again, a minor fault; nothing is lost). On this machine, under
# load, 1 to 4 pages of a 64 MiB segment's 16 385 were unmapped again right after a call that
# succeeded (4 segments in about 4 500; no reclaim, migration or compaction was counted in
# /proc/vmstat meanwhile), so an exact count of resident pages fails now and then. What is
# guaranteed: the one call over the whole mapping succeeded, and nearly every page is mapped.
TAKEN_BACK = 16   # pages the kernel may have unmapped again by the time we look (seen: up to 4)


def _spy_on_prefault(monkeypatch):
    """A list that gets (address, size, done) for every populate call (the real one still runs)."""
    calls, real = [], mapping.prefault

    def spied(ptr, size):
        done = real(ptr, size)
        calls.append((ptr, size, done))
        return done
    monkeypatch.setattr(mapping, "prefault", spied)
    return calls


def _assert_mapped_whole(start_of_map, nbytes):
    """Every page of the segment at `start_of_map` (64-byte header + `nbytes`) is mapped in this
    process, but for the few the kernel may have taken back already (TAKEN_BACK)."""
    pages = -(-(64 + nbytes) // 4096)
    resident = _rss_kib(start_of_map) // 4
    assert pages - TAKEN_BACK <= resident <= pages, f"{resident} of {pages} pages mapped"


@needs_populate
@pytest.mark.parametrize("nbytes", [1 << 20, 64 << 20])
def test_a_new_segment_is_mapped_before_the_copy(strategy, nbytes, monkeypatch):
    calls = _spy_on_prefault(monkeypatch)
    segment = sharing.allocate(nbytes, strategy)
    start_of_map = segment.array.ctypes.data - (segment.array.ctypes.data % 4096)
    assert calls == [(start_of_map, 64 + nbytes, True)]   # one call, the whole mapping, done
    _assert_mapped_whole(start_of_map, nbytes)            # every page in, nothing written yet
    del segment


@needs_populate
def test_without_the_populate_call_the_pages_come_in_only_when_written(strategy, monkeypatch):
    # the control: the same segment made the old way has no page mapped until the copy
    monkeypatch.setattr(mapping, "prefault", lambda ptr, size: False)   # no populate call
    segment = sharing.allocate(1 << 20, strategy)
    start_of_map = segment.array.ctypes.data - (segment.array.ctypes.data % 4096)
    assert _rss_kib(start_of_map) <= 8               # the 64-byte header's page, at most
    segment.array[:] = 1
    _assert_mapped_whole(start_of_map, 1 << 20)
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


# -- a new segment is filled by write(2): one pass over memory -----------------------------------

def test_a_fresh_put_writes_the_bytes_in_without_mapping_them(strategy):
    # The bytes go into the new file by write(2), and the mapping is made after: no page of it is
    # mapped yet (the kernel's count of our pages there is the header's page at most), and yet
    # it reads back every byte. (Mapping first and copying would map every page.)
    values = (np.arange(1 << 20, dtype=np.uint32) * np.uint32(2654435761)).view(np.uint8)
    t = mpviz.from_numpy(values.copy())
    t.share_memory_()
    data = t.untyped_storage()._data
    start_of_map = data.ctypes.data - (data.ctypes.data % 4096)
    assert _rss_kib(start_of_map) <= 8
    assert np.array_equal(data, values)
    assert t.untyped_storage().location == strategy


def _header_and_bytes(storage):
    """The segment's header (the 64 bytes before the data) and its bytes, as this process maps them."""
    segment = storage._segment
    return bytes(segment._buf[:64]), bytes(segment._buf[64:64 + segment.nbytes])


def test_a_zero_byte_tensor_gets_a_segment_with_its_header(strategy):
    t = mpviz.zeros(0)
    t.share_memory_()
    header, data = _header_and_bytes(t.untyped_storage())
    assert t.is_shared() and data == b"" and t.numpy().shape == (0,)
    assert header == (1).to_bytes(8, "little") + bytes(56)


@pytest.mark.parametrize("nbytes", [1, 63, 4095, 4097, 65 * 1024 + 3, (1 << 20) + 13])
def test_odd_sizes_land_after_the_header_with_the_count_of_one(strategy, nbytes):
    values = np.random.default_rng(nbytes).integers(1, 256, nbytes, dtype=np.uint8)  # no zero byte
    t = mpviz.from_numpy(values.copy())
    t.share_memory_()
    header, data = _header_and_bytes(t.untyped_storage())
    assert data == values.tobytes()
    assert header == (1).to_bytes(8, "little") + bytes(56)    # count 1; the rest (channels) zeroed


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int16", "int64", "uint8", "bool",
                                   "complex64"])
def test_every_dtype_arrives_equal(strategy, dtype):
    values = (np.arange(3 * 1000 + 1) % 7).astype(dtype)
    t = mpviz.from_numpy(values.copy())
    t.share_memory_()
    assert t.is_shared()
    assert np.array_equal(t.numpy(), values)


def _echo_sum(q, out):
    t = q.get()
    out.put((tuple(t.shape), t.numpy().tolist()))
    del t


def test_a_view_of_a_fresh_tensor_arrives_as_that_view(strategy):
    # a strided view shares its whole storage: the storage's bytes (one run) are written,
    # the view's offset and strides travel in the handle
    ctx = mp.get_context("fork")
    base = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    t = mpviz.from_numpy(base.copy())
    view = t[1::2, ::2]
    q, out = ctx.Queue(), ctx.Queue()
    p = start(ctx, _echo_sum, q, out)
    q.put(view)
    assert out.get(timeout=60) == ((3, 3), base[1::2, ::2].tolist())
    finish(p)
    assert t.is_shared() and np.array_equal(t.numpy(), base)
    q.close(), out.close()


def test_bytes_that_are_not_one_run_are_copied(strategy):
    # write(2) needs one run of bytes; a storage over strided memory takes the copy path
    from mpviz.storage import Storage
    backing = np.arange(2 * 5000, dtype=np.uint8)
    storage = Storage(_data=backing[::2])
    assert not storage._data.flags.c_contiguous
    storage.share_memory_(strategy)
    assert storage.is_shared() and np.array_equal(storage._data, backing[::2])


def test_allocate_refuses_data_of_another_size(strategy):
    with pytest.raises(ValueError, match="must match. Fix:"):
        sharing.allocate(10, strategy, np.zeros(11, np.uint8))


def test_a_reused_segment_is_filled_by_a_copy(strategy):
    # with the cache on, a segment parked earlier comes back instead of a new one: every one of
    # its old bytes is overwritten by the new tensor's
    from mpviz.sharing import allocator
    old = allocator.stats()["budget"]
    allocator.enable(8 << 20)
    try:
        t = mpviz.from_numpy(np.full(70_001, 0xAB, np.uint8)).share_memory_()
        first = t.untyped_storage()._segment.key
        del t
        values = np.random.default_rng(1).integers(0, 256, 70_001, dtype=np.uint8)
        u = mpviz.from_numpy(values.copy()).share_memory_()
        assert u.untyped_storage()._segment.key == first
        assert np.array_equal(u.numpy(), values)
        del u
    finally:
        allocator.enable(old)


@needs_populate
def test_with_the_cache_on_a_written_segment_is_mapped_whole(strategy):
    # it may come back for a copy into it: its pages are mapped in one call after the write,
    # so that copy does not fault them in one by one
    from mpviz.sharing import allocator
    old = allocator.stats()["budget"]
    allocator.enable(8 << 20)
    try:
        values = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8)
        t = mpviz.from_numpy(values.copy()).share_memory_()
        data = t.untyped_storage()._data
        _assert_mapped_whole(data.ctypes.data - data.ctypes.data % 4096, 1 << 20)
        assert np.array_equal(t.numpy(), values)
        del t, data
    finally:
        allocator.enable(old)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
def test_from_numpy_of_an_empty_array_is_an_empty_tensor_that_travels(shape):
    # It raised "buffer is too small for requested array" (a scalar view of 0 bytes).
    t = mpviz.from_numpy(np.zeros(shape, np.uint8))
    assert tuple(t.shape) == shape and t.numel() == 0
    t.share_memory_()
    assert t.is_shared() and tuple(t.shape) == shape


# -- a written segment is not fallocated first: the write reserves its pages --------------------

def _count_fallocates(monkeypatch):
    """A list that gets the length of every ``posix_fallocate`` call (the real one still runs)."""
    import os
    calls, real = [], os.posix_fallocate

    def counted(fd, offset, length):
        calls.append(length)
        return real(fd, offset, length)
    monkeypatch.setattr(os, "posix_fallocate", counted)
    return calls


@pytest.mark.parametrize("nbytes", [1, 4096 - 64, 4096 - 63, (1 << 20) + 13])
def test_a_written_segment_is_not_fallocated_first(strategy, monkeypatch, nbytes):
    # fallocate would walk every page once, the write a second time: the write alone allocates
    # each page it fills, and nbytes >= 1 after the 64-byte header puts a byte on every page
    calls = _count_fallocates(monkeypatch)
    values = np.random.default_rng(nbytes).integers(1, 256, nbytes, dtype=np.uint8)
    t = mpviz.from_numpy(values.copy()).share_memory_()
    assert calls == []
    header, data = _header_and_bytes(t.untyped_storage())
    assert data == values.tobytes() and header == (1).to_bytes(8, "little") + bytes(56)


def test_a_segment_with_nothing_written_is_still_fallocated(strategy, monkeypatch):
    # no bytes to write (a segment for the caller to fill; a 0-byte tensor): fallocate reserves
    # the pages, so a full /dev/shm is an error now rather than a SIGBUS at the first touch
    calls = _count_fallocates(monkeypatch)
    segment = sharing.allocate(1 << 20, strategy)
    empty = mpviz.zeros(0).share_memory_()
    assert calls == [64 + (1 << 20), 64 + 1]
    del segment, empty


_FULL_SHM_CHILD = r"""
import json, os, sys
import numpy as np
import mpviz, mpviz.multiprocessing as mp
from mpviz.errors import SharedMemoryFullError

def used():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize

out = {}
for strategy in ("file_descriptor", "file_system"):
    mp.set_sharing_strategy(strategy)
    before = used()
    big = mpviz.from_numpy(np.full(6 << 20, 5, np.uint8))       # 6 MiB into a 4 MiB /dev/shm
    try:
        big.share_memory_()
        seen = "no error"
    except SharedMemoryFullError as e:
        seen = [e.errno, e.strategy, "Fix:" in str(e), "/dev/shm is full" in str(e)]
    after_error = used() - before                                # the half-written file is gone
    small = np.arange(1 << 20, dtype=np.uint8)                   # and a tensor that fits still goes
    t = mpviz.from_numpy(small.copy()).share_memory_()
    out[strategy] = [seen, after_error, bool(np.array_equal(t.numpy(), small)), t.is_shared()]
    del t
print(json.dumps(out))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mount)")
def test_a_write_that_fills_dev_shm_raises_shared_memory_full(tmp_path):
    # a real 4 MiB tmpfs on /dev/shm in a private mount namespace: the write stops at ENOSPC
    # part way through a 6 MiB tensor, and that is the same clear error as fallocate's was
    out = run_with_small_dev_shm("4m", _FULL_SHM_CHILD, timeout=90)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for strategy in ("file_descriptor", "file_system"):
        seen, left_behind, intact, shared = result[strategy]
        assert seen == [28, strategy, True, True]
        assert left_behind == 0 and intact and shared


# -- where /dev/shm allows 2 MiB pages (tmpfs huge=within_size) ---------------------------------

_HUGE_SHM_CHILD = r"""
import json
import numpy as np
import mpviz, mpviz.multiprocessing as mp
from bench.bench_fresh import dev_shm_mount
from test_fresh_put import _smaps_kib

def pmd_mapped_kib(address):
    return _smaps_kib(address, ("FilePmdMapped:", "ShmemPmdMapped:"))

out = {"mount": dev_shm_mount()}
values = (np.arange(8 << 20, dtype=np.uint64) % 251).astype(np.uint8)
# the control: a plain file in the same tmpfs, written and mapped, not mpviz's
import mmap, os
with open("/dev/shm/control", "wb") as f:
    f.write(values.tobytes())
with open("/dev/shm/control", "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
control = np.frombuffer(m, dtype=np.uint8)
int(control.sum())                                             # reads (maps) every page
out["control"] = pmd_mapped_kib(control.ctypes.data)
del control
m.close()
os.unlink("/dev/shm/control")
for strategy in ("file_descriptor", "file_system"):
    mp.set_sharing_strategy(strategy)
    t = mpviz.from_numpy(values.copy()).share_memory_()
    data = t.untyped_storage()._data
    intact = bool(np.array_equal(t.numpy(), values))          # reads (maps) every page
    out[strategy] = [pmd_mapped_kib(data.ctypes.data - data.ctypes.data % 4096), intact]
    del t, data
print(json.dumps(out))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mount)")
def test_where_dev_shm_allows_huge_pages_a_fresh_segment_gets_them():
    # mpviz's segments are files in /dev/shm (not memfds), so a /dev/shm mounted huge=within_size
    # gives them 2 MiB pages, as it does torch's: written by write(2), mapped by 2 MiB at a time.
    # A real tmpfs in a private mount namespace, as bench_fresh --huge makes.
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mount = "mount -t tmpfs -o size=64m,huge=within_size tmpfs /dev/shm"
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          f'{mount} && exec "$@"', "sh", sys.executable, "-c", _HUGE_SHM_CHILD],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests")])), timeout=90)
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"no private tmpfs with huge pages here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mount"] == "huge=within_size"
    if result["control"] < 4 * 2048:
        pytest.skip(f"this kernel gave a plain file in that tmpfs {result['control']} KiB of 2 MiB "
                    f"pages (shmem huge pages denied, or memory too fragmented): no huge pages "
                    f"to expect of mpviz's segments either")
    for strategy in ("file_descriptor", "file_system"):
        pmd_kib, intact = result[strategy]
        assert intact
        assert pmd_kib >= 4 * 2048, f"{strategy}: {pmd_kib} KiB mapped by 2 MiB pages, of 8 MiB"


def test_bench_fresh_runs_itself_again_without_its_huge_option(monkeypatch):
    # Inside the namespace the same run again, with no --huge (or it would mount and run itself
    # again, for ever): written however argparse accepted it, an abbreviation included.
    import bench.bench_fresh as bench
    runs = []
    monkeypatch.setattr(bench, "in_huge_namespace", lambda mode, argv: runs.append(argv) or 0)
    bench.main(["--huge", "within_size", "--rounds", "3"])
    bench.main(["--sizes", "4K", "--huge=always"])
    bench.main(["--hug=always", "--sizes", "1M"])
    for argv in runs:
        assert not any(a.startswith("--hu") for a in argv), argv
    assert runs[0][:2] == ["--rounds", "3"]
    assert runs[1][2:] == ["--sizes", "4K"] and runs[2][2:] == ["--sizes", "1M"]
