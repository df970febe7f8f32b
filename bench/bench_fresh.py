"""A fresh tensor's put, with the default settings, side by side with torch and with memcpy.

``python -m bench.bench_fresh [--rounds N] [--sizes 4K,1M,64M,256M] [--json FILE] [--huge MODE]``

``--huge within_size`` (or ``always``, ``advise``, ``never``) runs the whole bench in a private
mount namespace whose /dev/shm is a fresh tmpfs mounted with ``huge=MODE`` (root only, and
``unshare`` from util-linux): both libraries' segments then live there, and tmpfs may give them
2 MiB pages. Nothing outside the namespace sees that mount; the machine's /dev/shm is untouched.

What the default settings cost: the shared-memory cache is off, so every put of a brand-new
tensor makes a new segment and copies the bytes into it. How those bytes get in decides the cost
(see mpviz/sharing/mapping.py)::

    fault by copy:   mmap ─▶ copy ─▶ fault (zero a page) ─▶ copy ─▶ fault ...   (torch)
    populate + copy: mmap ─▶ madvise(MADV_POPULATE_WRITE): zero every page ─▶ copy   (two passes)
    write:           pwrite(fd, bytes, 64) ─▶ mmap                     (one pass: a page a write
                                                                         fills is not zeroed, and
                                                                         the write allocates it)

Every contender is its own process with an echo child (bench/handoff.py's driver), timing the
round trip parent ``put`` → child ``get`` → child ``put`` → parent ``get`` of a tensor made before
the clock starts. The contenders take turns batch by batch, round after round, so that the load
of this machine falls on all of them alike; the numbers are medians over every trip.

* ``mpviz <strategy>``: today's code (write, the write allocating the pages).
* ``mpviz <strategy>, fallocate + write``: the same code with ``posix_fallocate`` before the
  write, the way before (the bench patches each strategy's ``reserve``: :func:`patch_the_way`).
* ``mpviz <strategy>, populate + copy``: the same code filling by map, populate, copy, the way
  before that (the bench patches ``sharing.allocate``). mpviz itself keeps no switch for either.
* ``torch <strategy>``: ``torch.multiprocessing``'s Queue, the same round trip.
* ``ways``: in one process, the ways of making a new shared segment and getting the bytes in,
  under both strategies (an unlinked ``shm_open`` object; a named ``/dev/shm/mpviz_bench_*``),
  beside torch's ``share_memory_()`` of a fresh tensor and ``np.copyto`` into pages already
  mapped (the floor for any copy), in turn, round after round.
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

# name: (library, sharing strategy, how mpviz fills a new segment)
CONTENDERS = {
    "mpviz fd": ("mpviz", "file_descriptor", "write"),
    "mpviz fd, fallocate + write": ("mpviz", "file_descriptor", "fallocate + write"),
    "mpviz fd, populate + copy": ("mpviz", "file_descriptor", "populate + copy"),
    "torch fd": ("torch", "file_descriptor", None),
    "mpviz fs": ("mpviz", "file_system", "write"),
    "mpviz fs, fallocate + write": ("mpviz", "file_system", "fallocate + write"),
    "mpviz fs, populate + copy": ("mpviz", "file_system", "populate + copy"),
    "torch fs": ("torch", "file_system", None),
}
BATCH = {4 * KiB: 20, MiB: 10, 64 * MiB: 3, 256 * MiB: 1}


# -- the driver side (a subprocess per contender) -------------------------------------------------

def drive(name):
    """Answer 'rt SIZE N' with N fresh round trips; 'ways SIZE' with the one-process timings."""
    from bench import handoff
    if name == "ways":
        driver = None
    else:
        library, strategy, fill = CONTENDERS[name]
        handoff.CONTENDERS[name] = (library, "fork", strategy, 0)   # cache off: the default
        driver = handoff.Driver(name)
        if library == "mpviz":
            patch_the_way(fill)

    def answer(words):
        if words[0] == "rt":
            return driver.rt("fresh", int(words[1]), int(words[2]))
        return ways(int(words[1]))

    handoff.serve(driver, answer)


def patch_the_way(fill):
    """Make this process's mpviz fill a new segment the way `fill` names: "write" is mpviz as it
    is; the others are the ways before, put back by patching the functions they changed."""
    from mpviz import sharing
    from mpviz.sharing import file_descriptor, file_system, segment
    if fill == "fallocate + write":          # reserve every page first, then write as today
        def reserve(fd, size, strategy, written=False):
            return segment.reserve(fd, size, strategy)      # (written=False: posix_fallocate)
        file_descriptor.reserve = file_system.reserve = reserve
    elif fill == "populate + copy":          # a mapped, populated segment, then a copy into it
        allocate = sharing.allocate

        def allocate_then_copy(nbytes, strategy, data=None):
            new = allocate(nbytes, strategy)
            if data is not None:
                new.array[...] = data
            return new
        sharing.allocate = allocate_then_copy
    elif fill != "write":
        raise ValueError(f"no way to fill a segment called {fill!r}; expected one of "
                         f"{sorted({c[2] for c in CONTENDERS.values() if c[2]})}")


# -- memcpy, torch, and the ways of filling a new segment ---------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
MADV_POPULATE_WRITE = 23
HEADER = 64                      # mpviz's header: the bytes go in after it, as in mpviz
_sources = {}
_torch_warm = set()

WAYS = {
    # name: (posix_fallocate first, fill, mmap flags)
    "fault by copy (torch's way)": (True, "copy", 0),
    "populate + copy (mpviz, 2nd way)": (True, "populate + copy", 0),
    "fallocate + write (mpviz, 3rd way)": (True, "write", 0),
    "write, no fallocate (mpviz now)": (False, "write", 0),
    "write + MAP_POPULATE": (True, "write", mmap.MAP_POPULATE),
    "2 threads write a half each": (False, "write halves", 0),
    "2 threads populate + copy a half each": (False, "populate + copy halves", 0),
}
_pool = None


def _halves(size):
    """Two runs of bytes covering `size`, split at a page boundary of the file."""
    cut = max(0, (HEADER + size // 2) // mmap.PAGESIZE * mmap.PAGESIZE - HEADER) or size // 2
    return [(0, cut), (cut, size)]


def _in_two_threads(job, size):
    """Run job(start, end) for each half at once, on two threads (os.pwrite, madvise through
    ctypes and np.copyto all let go of the GIL)."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(2)
    for f in [_pool.submit(job, a, b) for a, b in _halves(size)]:
        f.result()


def _way(size, how, strategy):
    """Seconds to make a new shared segment of `size` bytes (after a 64-byte header) the way
    `how`, under `strategy`, with the bytes of the source in it."""
    import _posixshmem
    import numpy as np
    from mpviz.sharing.mapping import write_into
    fallocate, fill, flags = WAYS[how]
    src, total = _sources[size], HEADER + max(size, 1)
    name = f"/mpviz_bench_{os.getpid()}"
    t0 = time.perf_counter()
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    if strategy == "file_descriptor":
        _posixshmem.shm_unlink(name)            # anonymous at once; file_system keeps the name
    os.ftruncate(fd, total)
    if fallocate:
        os.posix_fallocate(fd, 0, total)
    if fill == "write":
        write_into(fd, src, HEADER)
    elif fill == "write halves":      # tmpfs takes the file's lock for each write: they take turns
        _in_two_threads(lambda a, b: write_into(fd, src[a:b], HEADER + a), size)
    ptr = _libc.mmap(None, total, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | flags, fd, 0)
    if fill == "populate + copy halves":   # page faults take no file lock: really at once
        dst = np.frombuffer((ctypes.c_char * total).from_address(ptr), np.uint8, count=size, offset=HEADER)

        def half(a, b):
            first = (ptr + HEADER + a) // mmap.PAGESIZE * mmap.PAGESIZE
            _libc.madvise(first, ptr + HEADER + b - first, MADV_POPULATE_WRITE)
            np.copyto(dst[a:b], src[a:b])
        _in_two_threads(half, size)
        del dst
    elif fill in ("copy", "populate + copy"):
        if fill == "populate + copy":
            _libc.madvise(ptr, total, MADV_POPULATE_WRITE)
        dst = np.frombuffer((ctypes.c_char * total).from_address(ptr), np.uint8, count=size, offset=HEADER)
        np.copyto(dst, src)
        del dst
    if strategy == "file_system":
        os.close(fd)                            # holders keep no descriptor
    elapsed = time.perf_counter() - t0
    if strategy == "file_system":
        _posixshmem.shm_unlink(name)
    else:
        os.close(fd)
    _libc.munmap(ptr, total)
    return elapsed


def _torch_share(size, strategy):
    import torch
    import torch.multiprocessing
    torch.multiprocessing.set_sharing_strategy(strategy)
    t = torch.from_numpy(_sources[size].copy())  # a fresh tensor, in private memory
    t0 = time.perf_counter()
    t.share_memory_()
    elapsed = time.perf_counter() - t0
    del t
    return elapsed


def ways(size):
    import numpy as np
    if size not in _sources:
        _sources[size] = np.full(size, 7, dtype=np.uint8)
    src = _sources[size]
    dst = np.zeros_like(src)            # pages mapped and written: the floor
    t0 = time.perf_counter()
    np.copyto(dst, src)
    out = {"memcpy into mapped pages": time.perf_counter() - t0}
    del dst
    for short, strategy in (("fd", "file_descriptor"), ("fs", "file_system")):
        if strategy not in _torch_warm:   # torch's first share starts its shm manager: not timed
            _torch_share(size, strategy)
            _torch_warm.add(strategy)
        out[f"torch share_memory_() {short}"] = _torch_share(size, strategy)
        for how in WAYS:
            out[f"{how} {short}"] = _way(size, how, strategy)
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
    drivers = {name: Driver(name) for name in list(CONTENDERS) + ["ways"]}
    times, errors = {}, {}
    try:
        for size in sizes:
            log(f"{human(size)}: {rounds} rounds, contenders in turn")
            for r in range(rounds):
                for name, d in drivers.items():
                    reply = d.ask(f"ways {size}" if name == "ways" else f"rt {size} {BATCH[size]}")
                    if "error" in reply:
                        errors[f"{name} {human(size)}"] = reply["error"]
                    elif name == "ways":
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
        for which in ("", ", fallocate + write", ", populate + copy"):
            mine, theirs = med.get(f"mpviz {short}{which}", {}), med.get(f"torch {short}", {})
            cells = [f"{mine[s] / theirs[s]:.2f}×" if s in mine and s in theirs else "—" for s in sizes]
            lines.append(f"| mpviz{which or ' (write)'} ÷ torch, {strategy} | " + " | ".join(cells) + " |")
    lines += ["", "### A new shared segment, made and filled in one process (median; ÷ torch's "
              "share_memory_() under the same strategy)", "", head.format("way"), rule]
    for short in ("fd", "fs"):
        torch_row = med.get(f"torch share_memory_() {short}", {})
        for how in ("memcpy into mapped pages", "torch share_memory_()") + tuple(WAYS):
            key = how if how.startswith("memcpy") else f"{how} {short}"
            if how.startswith("memcpy") and short == "fs":
                continue
            cells = [f"{fmt(med[key][s])} ({med[key][s] / torch_row[s]:.2f}×)"
                     if s in med.get(key, {}) and s in torch_row else "—" for s in sizes]
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    unit = {"K": KiB, "M": MiB}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * unit


def in_huge_namespace(mode, argv):
    """Run this bench again, with `argv`, in a private mount namespace whose /dev/shm is a new
    tmpfs mounted ``huge=mode``; its exit status. Raises SystemExit with what to do where that
    cannot be done (not root, no ``unshare``)."""
    if os.geteuid() != 0:
        raise SystemExit("--huge needs root: it mounts a tmpfs (in a private mount namespace). "
                         "Fix: run as root, or leave --huge out to measure the machine's own /dev/shm.")
    mount = f"mount -t tmpfs -o huge={mode} tmpfs /dev/shm"
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", f'{mount} && exec "$@"',
           "sh", sys.executable, "-m", "bench.bench_fresh", *argv]
    try:
        return subprocess.run(cmd, cwd=ROOT).returncode
    except FileNotFoundError:
        raise SystemExit("--huge needs the unshare command (util-linux). Fix: install util-linux, "
                         "or leave --huge out.") from None


def dev_shm_mount():
    """The options /dev/shm is mounted with here (the last mount of it wins), e.g. 'huge=within_size'."""
    with open("/proc/self/mounts") as f:
        options = [line.split()[3] for line in f if line.split()[1] == "/dev/shm"]
    opts = options[-1].split(",") if options else []
    return ",".join(o for o in opts if o.startswith("huge=")) or "no huge= option (huge=never)"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.bench_fresh", description=__doc__.splitlines()[0])
    ap.add_argument("--driver", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=7, help="rounds per size (default 7)")
    ap.add_argument("--sizes", default="4K,1M,64M,256M", help="comma-separated, e.g. 4K,1M (default: all four)")
    ap.add_argument("--json", help="also write the medians (seconds) to this file")
    ap.add_argument("--huge", choices=["never", "always", "within_size", "advise"],
                    help="run in a private mount namespace whose /dev/shm is a tmpfs mounted huge=MODE "
                         "(root only; the machine's /dev/shm is not changed)")
    args = ap.parse_args(argv)
    if args.driver:
        drive(args.driver)
        return 0
    if args.huge:
        inside = ["--rounds", str(args.rounds), "--sizes", args.sizes]   # the same run, inside
        if args.json:
            inside += ["--json", os.path.abspath(args.json)]   # (it runs in ROOT)
        return in_huge_namespace(args.huge, inside)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    bad = [human(s) for s in sizes if s not in BATCH]
    if bad:
        ap.error(f"sizes {bad} have no batch plan; choose among 4K, 1M, 64M, 256M")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    load0 = os.getloadavg()
    med, errors = measure(sizes, args.rounds, log)
    load1 = os.getloadavg()
    print(f"{os.cpu_count()} cores, kernel {os.uname().release}, /dev/shm: {dev_shm_mount()}, "
          f"load average {load0[0]:.1f} at start, {load1[0]:.1f} at end; {args.rounds} rounds, "
          f"contenders in turn\n")
    print(table(med, sizes))
    for what, err in errors.items():
        print(f"\n{what}: {err}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: {str(s): t for s, t in per.items()} for name, per in med.items()}, f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
