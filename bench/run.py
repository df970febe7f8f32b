"""Measure mpviz against torch.multiprocessing, the stdlib and the floor, side by side, in one run.

    python -m bench            # full run (a few minutes): writes bench/RESULTS.md and bench/results/*.json
    python -m bench --quick    # smoke run (~half a minute): small sizes, fewer repeats, no torch

How it measures (read this before trusting a number):

* Every contender runs in its **own driver process** (:mod:`bench.handoff`) with its own echo child;
  torch and mpviz never share an interpreter. The drivers are started once and then asked **in
  turn, one small batch each, round after round**, so that a burst of load from something else on
  the machine hits every contender alike, instead of whichever happened to run then.
* A *round trip* is parent ``put`` → child ``get`` → child ``put`` → parent ``get``; the child drops
  its reference each time. Reported: median, min and max over every round trip, in µs or ms.
* ``shared``: the same tensor each time, already in shared memory. ``fresh``: a new tensor each
  time (made before the clock starts), so the put copies it into shared memory.
* ``memcpy``: ``np.copyto`` into pages already faulted in, and into brand-new shared pages — the
  two speeds that decide what a fresh tensor costs.
* Start-up (:mod:`bench.startup`): ``mpviz trace -- true`` against ``true``, ``import mpviz``
  in a fresh interpreter, and ``spawn(nprocs=2)`` of an empty function from a script of its own
  (:mod:`bench.spawn_startup`) for mpviz and torch, alternating round by round.
* The other benchmarks in ``bench/`` (``bench_*.py``) are run too, as subprocesses, and their
  tables are folded in.

Nothing here is a guess: each number in ``RESULTS.md`` was printed by this script, with the
machine, versions and load it ran under.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 1 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [4 * KiB, 1 * MiB]


def save_results(filename, data):
    """Write `data` as JSON to ``bench/results/<filename>`` and return the path (the bench_*.py
    scripts' files are then folded into the report by :func:`run_other_benches`)."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, filename)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    return path


def human(nbytes):
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def fmt(seconds):
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def summary(times):
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def cell(s):
    if not s:
        return "—"
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


# -- drivers --------------------------------------------------------------------------------------

class DriverProcess:
    """A contender's driver (``python -m bench.handoff NAME``, or the `module` given, run with
    `args`), spoken to one JSON line at a time."""

    def __init__(self, name, env=None, module="bench.handoff", args=None):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", module, *(args or [name])], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        self.ready = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"driver {self.name!r} exited (code {self.proc.poll()})"}
        return json.loads(line)

    def ask(self, command):
        if self.proc.poll() is not None:
            return {"error": f"driver {self.name!r} is gone"}
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def torch_available():
    try:
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def plan(size, kind, quick):
    """(rounds, batch) for one size: fewer, longer-apart samples where a trip takes long."""
    if quick:
        return (3, 10) if size <= MiB else (2, 2)
    if kind == "shared":
        return (10, 40) if size <= 64 * MiB else (10, 20)
    return {4 * KiB: (10, 20), MiB: (10, 10), 64 * MiB: (6, 3), 256 * MiB: (4, 2)}[size]


def slow_for(name, size, kind):
    """Contenders that copy everything get fewer samples at the big sizes (hundreds of ms each)."""
    return name.startswith("stdlib") and size >= 64 * MiB


def run_handoff(contenders, sizes, quick, log):
    drivers = {name: DriverProcess(name) for name in contenders}
    results = {}
    notes = {}
    try:
        for name, d in drivers.items():
            if "error" in d.ready:
                notes[name] = d.ready["error"]
        for size in sizes:
            for kind in ("shared", "fresh"):
                rounds, batch = plan(size, kind, quick)
                log(f"  {human(size)} {kind}: {rounds} rounds x {batch} per contender, alternating")
                for r in range(rounds):
                    for name, d in drivers.items():
                        if name in notes:
                            continue
                        n = batch
                        if slow_for(name, size, kind):
                            if r >= 2:
                                continue
                            n = 1
                        reply = d.ask(f"rt {kind} {size} {n}")
                        if "error" in reply:
                            notes[f"{name} {kind} {human(size)}"] = reply["error"]
                            continue
                        if "skipped" in reply:
                            continue
                        entry = results.setdefault(name, {}).setdefault(kind, {}).setdefault(
                            str(size), {"times": []})
                        entry["times"].extend(reply["times"][1:] if r == 0 and n > 2 else reply["times"])
                        if "cache" in reply:
                            entry["cache"] = reply["cache"]
    finally:
        for d in drivers.values():
            d.close()
    for name, kinds in results.items():
        for kind, per_size in kinds.items():
            for size, entry in per_size.items():
                entry.update(summary(entry["times"]))
    return results, notes


def run_memcpy(sizes, quick):
    """memcpy into pages already in vs into brand-new shared pages (the fresh tensor's cost)."""
    import mmap

    import numpy as np
    out = {}
    reps = 3 if quick else 7
    for size in sizes:
        src = np.ones(size, dtype=np.uint8)
        dst = np.empty_like(src)
        dst[:] = 0  # fault the pages in
        warm, cold = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            warm.append(time.perf_counter() - t0)
            m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)  # new shared pages, not yet touched
            fresh = np.frombuffer(m, dtype=np.uint8)
            t0 = time.perf_counter()
            np.copyto(fresh, src)
            cold.append(time.perf_counter() - t0)
            del fresh
            m.close()
        out[str(size)] = {"faulted_in": summary(warm), "fresh_shared_pages": summary(cold)}
    return out


def _json_files():
    """{file name: modification time} of the JSON files in bench/results/ now."""
    return {os.path.basename(p): os.path.getmtime(p)
            for p in glob.glob(os.path.join(RESULTS_DIR, "*.json"))}


def run_other_benches(quick, log):
    """Run bench/bench_*.py (written by others) and keep their printed tables and new JSON files."""
    out = {}
    for script in sorted(glob.glob(os.path.join(HERE, "bench_*.py"))):
        name = os.path.basename(script)
        before = _json_files()
        log(f"  {name}{' --quick' if quick else ''}")
        try:
            r = subprocess.run([sys.executable, script] + (["--quick"] if quick else []), cwd=ROOT,
                               capture_output=True, text=True, timeout=120 if quick else 1200)
            code, stdout, stderr = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            code, stdout, stderr = "timeout", e.stdout or "", e.stderr or ""
            stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        table = [line for line in stdout.splitlines() if line.startswith("|")]
        written = [f for f, mtime in _json_files().items() if before.get(f) != mtime]
        data = {}
        for fname in written:
            try:
                with open(os.path.join(RESULTS_DIR, fname)) as f:
                    data[fname] = json.load(f)
            except (OSError, ValueError):
                pass
        out[name] = {"exit": code, "table": table, "json": data,
                     "stderr_tail": (stderr or "")[-800:] if code != 0 else ""}
    return out


# -- the report -----------------------------------------------------------------------------------

def machine():
    model, cores = platform.processor() or "?", os.cpu_count()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"model": model, "cores": cores, "platform": platform.platform()}


def versions(torch_version):
    import numpy
    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "torch": torch_version or "not installed"}


def load():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def markdown(report):
    lines = []
    m, v = report["machine"], report["versions"]
    lines += [f"# mpviz benchmarks{' (quick smoke run)' if report['quick'] else ''}", "",
              f"- date: {report['date']}",
              f"- machine: {m['model']}, {m['cores']} cores ({m['platform']})",
              f"- python {v['python']}, numpy {v['numpy']}, torch {v['torch']}",
              f"- load average (1/5/15 min) at start: {report['load_start']}, at end: {report['load_end']}",
              f"- command: `{report['command']}`; contenders alternate batch by batch within one run",
              f"- {report.get('bytecode', 'bytecode: not compiled first')}", ""]
    rt = report["handoff"]
    names = list(rt)
    for kind, title in (("shared", "Round trip, tensor already shared (parent → child → parent)"),
                        ("fresh", "Round trip, fresh tensor each time (the put copies it into shared memory)")):
        sizes = report["sizes"]
        lines += [f"## {title}", "", "median (min–max)", "",
                  "| contender | " + " | ".join(human(s) for s in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for name in names:
            per = rt[name].get(kind)
            if not per:
                continue
            row = [cell(per.get(str(s))) for s in sizes]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines.append("")
        cache_rows = [(n, rt[n][kind]) for n in names if "+cache" in n and rt[n].get(kind)]
        if kind == "shared" and cache_rows:
            lines += ["`+cache`: the shared-memory cache on (`MPVIZ_SHM_CACHE_BYTES`, off by default): "
                      "the echo child keeps the mapping of each tensor it lets go of, so the next "
                      "arrival of the same memory needs no descriptor and no mmap. Without it, the "
                      "child still finds the Storage it has just sent back: its fd server keeps what "
                      "it offered until the parent's batched release arrives (file_descriptor, "
                      "`fd_passing.RELEASE_DELAY`), or it keeps what it received and sent on for one "
                      "to two ticks of `file_system.LINGER_SECONDS`.", ""]
        if kind == "fresh" and cache_rows:
            lines.append("Shared-memory cache (mpviz `+cache`, 256 MiB budget), hits/misses at the end of each size:")
            lines.append("")
            for n, per in cache_rows:
                parts = [f"{human(int(s))}: {e['cache']['hits']}/{e['cache']['misses']}"
                         for s, e in per.items() if e.get("cache")]
                lines.append(f"- {n}: " + ", ".join(parts) + " (cumulative)")
            lines.append("")
    lines += ["## memcpy (one process, `np.copyto`)", "",
              "| size | into pages already in | into brand-new shared pages |", "|---|---|---|"]
    for s, e in report["memcpy"].items():
        size = int(s)
        gbps = lambda x: f"{size / x['median'] / 1e9:.1f} GB/s"  # noqa: E731
        lines.append(f"| {human(size)} | {cell(e['faulted_in'])}, {gbps(e['faulted_in'])} | "
                     f"{cell(e['fresh_shared_pages'])}, {gbps(e['fresh_shared_pages'])} |")
    from bench import startup as startup_bench
    lines += ["", "## Start-up: `mpviz trace`, `import mpviz`, `spawn` (bench/startup.py)", "",
              "Each a fresh process, timed from outside; spawn from a script of its own, so each "
              "library's children import only what that script imports.", "",
              startup_bench.markdown(report["startup"], report.get("startup_errors", {})), ""]
    if report["notes"]:
        lines += ["## Notes", ""] + [f"- {k}: {v}" for k, v in report["notes"].items()] + [""]
    for name, other in report["others"].items():
        lines += [f"## {name}", "", f"exit: {other['exit']}; JSON: {', '.join(other['json']) or 'none'}", ""]
        lines += other["table"] or ["(no table printed)"]
        if other["stderr_tail"]:
            lines += ["", "```", other["stderr_tail"], "```"]
        lines.append("")
    return "\n".join(lines)


def compile_bytecode():
    """Compile mpviz's and bench's .py files to bytecode first, as installing a package does.

    torch's and numpy's bytecode was compiled when pip installed them; mpviz runs from this
    checkout. Where PYTHONDONTWRITEBYTECODE is set (this project's sandboxes set it), Python
    would never cache it, and every spawned child would compile mpviz again (~80 ms of a
    start-up here). Python still *reads* bytecode it finds, whatever that variable says."""
    import compileall
    failed = [d for d in ("mpviz", "bench") if not compileall.compile_dir(os.path.join(ROOT, d), quiet=1)]
    if failed:
        return f"compileall failed for {' and '.join(failed)}: spawned children compile from source"
    return "mpviz and bench compiled to bytecode first (compileall)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few repeats, no torch")
    parser.add_argument("--no-others", action="store_true", help="don't run the other bench_*.py scripts")
    parser.add_argument("--markdown", default=os.path.join(HERE, "RESULTS.md"),
                        help="where to write the Markdown table (default bench/RESULTS.md)")
    args = parser.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    os.makedirs(RESULTS_DIR, exist_ok=True)
    compiled = compile_bytecode()
    load_start = load()
    torch_version = None if args.quick else torch_available()
    sizes = QUICK_SIZES if args.quick else SIZES
    from bench.handoff import CONTENDERS
    contenders = [n for n in CONTENDERS if torch_version or not n.startswith("torch")]
    if args.quick:
        contenders = [n for n in contenders if n in ("mpviz fd fork", "mpviz fs fork", "mpviz fs spawn",
                                                     "mpviz fd fork +cache", "stdlib Queue+pickle",
                                                     "floor: shm name via SimpleQueue")]
    notes = {}
    if not torch_version:
        notes["torch"] = ("skipped in --quick runs" if args.quick else
                          "not installed: `python3 -m pip install --user torch` to compare")
    log(f"round trips: {len(contenders)} contenders, sizes {[human(s) for s in sizes]}")
    handoff, rt_notes = run_handoff(contenders, sizes, args.quick, log)
    notes.update(rt_notes)
    log("memcpy")
    memcpy = run_memcpy(sizes, args.quick)
    log("start-up: mpviz trace, import mpviz, spawn (bench/startup.py)")
    from bench import startup as startup_bench
    startup, su_errors = startup_bench.measure(2 if args.quick else 7, torch=bool(torch_version))
    notes.update({f"startup {k}": v for k, v in su_errors.items()})
    others = {} if args.no_others else run_other_benches(args.quick, log)

    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": machine(), "versions": versions(torch_version),
        "load_start": load_start, "load_end": load(), "sizes": sizes, "bytecode": compiled,
        "handoff": handoff, "memcpy": memcpy, "startup": startup, "startup_errors": su_errors,
        "notes": notes, "others": {k: {kk: vv for kk, vv in v.items() if kk != "json"} for k, v in others.items()},
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = save_results(f"handoff-{'quick-' if args.quick else ''}{stamp}.json", report)
    report["others"] = others
    text = markdown(report)
    with open(args.markdown, "w") as f:
        f.write(text + "\n")
    print(text)
    log(f"wrote {json_path} and {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
