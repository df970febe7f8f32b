"""A fresh tensor's put, with the default settings, side by side with torch and with memcpy.

``python -m bench.bench_fresh [--rounds N] [--sizes 4K,1M,64M,256M] [--json FILE]``

What the default settings cost: the shared-memory cache is off, so every put of a brand-new
tensor makes a new segment and copies the bytes into it. That copy writes pages the process has
never touched, and how they get mapped decides the cost (see mpviz/sharing/mapping.py)::

    fault by copy:   mmap ─▶ copy ─▶ page fault ─▶ copy ─▶ page fault ...     (one trap a page)
    populate:        mmap ─▶ madvise(MADV_POPULATE_WRITE) ─▶ copy              (one call, then memcpy)

Every contender is its own process with an echo child (bench/handoff.py's driver), timing the
round trip parent ``put`` → child ``get`` → child ``put`` → parent ``get`` of a tensor made before
the clock starts. The contenders take turns batch by batch, round after round, so that the load
of this machine falls on all of them alike; the numbers are medians over every trip.

* ``mpviz <strategy>``: today's code.
* ``mpviz <strategy>, before``: the same code with the populate call switched off
  (``mapping.PREFAULT = False``): the pages are faulted in by the copy, as before this change.
* ``torch <strategy>``: ``torch.multiprocessing``'s Queue, the same round trip.
* ``memcpy``: ``np.copyto`` of the same bytes into pages already mapped (the floor for any copy),
  and the ways of getting a new shared segment's pages in, each followed by the copy.
"""
import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KiB, MiB = 1 << 10, 1 << 20

# name: (library, sharing strategy, populate on)
CONTENDERS = {
    "mpviz fd": ("mpviz", "file_descriptor", True),
    "mpviz fd, before": ("mpviz", "file_descriptor", False),
    "torch fd": ("torch", "file_descriptor", None),
    "mpviz fs": ("mpviz", "file_system", True),
    "mpviz fs, before": ("mpviz", "file_system", False),
    "torch fs": ("torch", "file_system", None),
}
BATCH = {4 * KiB: 20, MiB: 10, 64 * MiB: 3, 256 * MiB: 1}


# -- the driver side (a subprocess per contender) -------------------------------------------------

def drive(name):
    """Answer 'rt SIZE N' with N fresh round trips; 'memcpy SIZE' with the copy timings."""
    if name == "memcpy":
        driver = None
    else:
        from bench import handoff
        library, strategy, populate = CONTENDERS[name]
        handoff.CONTENDERS[name] = (library, "fork", strategy, 0)   # cache off: the default
        driver = handoff.Driver(name)
        if library == "mpviz":
            from mpviz.sharing import mapping
            mapping.PREFAULT = populate
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            if words[0] == "rt":
                reply = driver.rt("fresh", int(words[1]), int(words[2]))
            else:
                reply = copy_ways(int(words[1]))
        except Exception as e:  # report, don't die: the table says what failed
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    if driver is not None:
        driver.close()


# -- memcpy, and the ways of faulting a new segment in ------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
MAP_POPULATE, MADV_POPULATE_WRITE, MADV_HUGEPAGE = 0x8000, 23, 14
_sources = {}


def _new_segment(size, fallocate=True, flags=0):
    import _posixshmem
    name = f"/mpviz_bench_{os.getpid()}"
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    _posixshmem.shm_unlink(name)
    try:
        os.ftruncate(fd, size)
        if fallocate:
            os.posix_fallocate(fd, 0, size)
        ptr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | flags, fd, 0)
    finally:
        os.close(fd)
    if ptr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return ptr


def _way(size, how):
    """Seconds to make a new shared segment of `size` bytes the way `how` and copy into it."""
    import numpy as np
    src = _sources[size]
    t0 = time.perf_counter()
    ptr = _new_segment(size, fallocate=how != "populate, no fallocate",
                       flags=MAP_POPULATE if how == "MAP_POPULATE" else 0)
    if how in ("populate (mpviz now)", "populate, no fallocate"):
        _libc.madvise(ptr, size, MADV_POPULATE_WRITE)
    elif how == "MADV_HUGEPAGE + populate":
        _libc.madvise(ptr, size, MADV_HUGEPAGE)
        _libc.madvise(ptr, size, MADV_POPULATE_WRITE)
    dst = np.frombuffer((ctypes.c_char * size).from_address(ptr), dtype=np.uint8)
    if how == "populate + copy, 2 threads" and size >= 4 * MiB:
        half = (size // 2) & ~4095
        def part(a, b):
            _libc.madvise(ptr + a, b - a, MADV_POPULATE_WRITE)
            np.copyto(dst[a:b], src[a:b])
        other = threading.Thread(target=part, args=(half, size))
        other.start()
        part(0, half)
        other.join()
    else:
        np.copyto(dst, src)
    elapsed = time.perf_counter() - t0
    del dst
    _libc.munmap(ptr, size)
    return elapsed


WAYS = ("fault by copy (before)", "populate (mpviz now)", "populate, no fallocate", "MAP_POPULATE",
        "MADV_HUGEPAGE + populate", "populate + copy, 2 threads")


def copy_ways(size):
    import numpy as np
    if size not in _sources:
        _sources[size] = np.full(size, 7, dtype=np.uint8)
    src = _sources[size]
    dst = np.zeros_like(src)            # pages mapped and written: the floor
    t0 = time.perf_counter()
    np.copyto(dst, src)
    out = {"memcpy into mapped pages": time.perf_counter() - t0}
    del dst
    for how in WAYS:
        out[how] = _way(size, how)
    return out


# -- the orchestrator ----------------------------------------------------------------------------

def Driver(name):
    """A contender's driver process (``python -m bench.bench_fresh --driver NAME``): the same
    line-at-a-time JSON talk as bench/run.py's, so its class serves."""
    from bench.run import DriverProcess
    return DriverProcess(name, module="bench.bench_fresh", args=["--driver", name])


def human(n):
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def fmt(s):
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def measure(sizes, rounds, log):
    drivers = {name: Driver(name) for name in list(CONTENDERS) + ["memcpy"]}
    times, errors = {}, {}
    try:
        for size in sizes:
            log(f"{human(size)}: {rounds} rounds, contenders in turn")
            for r in range(rounds):
                for name, d in drivers.items():
                    reply = d.ask(f"memcpy {size}" if name == "memcpy" else f"rt {size} {BATCH[size]}")
                    if "error" in reply:
                        errors[f"{name} {human(size)}"] = reply["error"]
                    elif name == "memcpy":
                        for how, t in reply.items():
                            times.setdefault(how, {}).setdefault(size, []).append(t)
                    else:
                        trips = reply["times"][1:] if r == 0 and len(reply["times"]) > 2 else reply["times"]
                        times.setdefault(name, {}).setdefault(size, []).extend(trips)
    finally:
        for d in drivers.values():
            d.close()
    return {name: {size: statistics.median(ts) for size, ts in per.items()} for name, per in times.items()}, errors


def table(med, sizes):
    head = "| {} | " + " | ".join(human(s) for s in sizes) + " |"
    rule = "|---|" + "---|" * len(sizes)
    lines = ["### Round trip of a fresh tensor, default settings (median)", "", head.format("contender"), rule]
    for name in CONTENDERS:
        lines.append(f"| {name} | " + " | ".join(fmt(med[name][s]) if s in med.get(name, {}) else "—"
                                                 for s in sizes) + " |")
    lines += ["", "### mpviz ÷ torch, same run (goal at 64 MiB: ≤ 0.5×)", "", head.format("ratio"), rule]
    for short, strategy in (("fd", "file_descriptor"), ("fs", "file_system")):
        for which in ("", ", before"):
            mine, theirs = med.get(f"mpviz {short}{which}", {}), med.get(f"torch {short}", {})
            cells = [f"{mine[s] / theirs[s]:.2f}×" if s in mine and s in theirs else "—" for s in sizes]
            label = f"mpviz ÷ torch, {strategy}" + (" (before: pages faulted by the copy)" if which else "")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "### A new shared segment, made and filled in one process (median; memcpy = the floor)", "",
              head.format("way"), rule]
    for how in ("memcpy into mapped pages",) + WAYS:
        lines.append(f"| {how} | " + " | ".join(fmt(med[how][s]) if s in med.get(how, {}) else "—"
                                                for s in sizes) + " |")
    return "\n".join(lines)


def parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = {"K": KiB, "M": MiB}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * unit


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_fresh", description=__doc__.splitlines()[0])
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per size (default 5)")
    ap.add_argument("--sizes", default="4K,1M,64M,256M", help="comma-separated, e.g. 4K,1M (default: all four)")
    ap.add_argument("--json", help="also write the medians (seconds) to this file")
    args = ap.parse_args(argv)
    if args.driver:
        drive(args.driver)
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    bad = [human(s) for s in sizes if s not in BATCH]
    if bad:
        ap.error(f"sizes {bad} have no batch plan; choose among 4K, 1M, 64M, 256M")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    load0 = os.getloadavg()
    med, errors = measure(sizes, args.rounds, log)
    load1 = os.getloadavg()
    print(f"{os.cpu_count()} cores, kernel {os.uname().release}, load average {load0[0]:.1f} at start, "
          f"{load1[0]:.1f} at end; {args.rounds} rounds, contenders in turn\n")
    print(table(med, sizes))
    for what, err in errors.items():
        print(f"\n{what}: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: {str(s): t for s, t in per.items()} for name, per in med.items()}, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
