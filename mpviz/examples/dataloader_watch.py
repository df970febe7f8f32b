"""Run notebook 13's memory programs and watch each DataLoader worker's memory from outside.

    run = watch("cache", limit_mb=256)     python notebooks/programs/dataloader_memory.py cache,
                                           its workers in a memory cgroup of 256 MiB (as root),
                                           else under a stand-in limit (see below)
    run = watch("list")                    no limit: only watch
    run.show(); run.picture("rss")         what it printed; each worker's memory over time
    oom_verdict(run); cow_growth(run)      what happened, from what was measured

The program runs in a session of its own (the kernel forks nothing). Every SAMPLE_SECONDS this
reads, for each child of the program (its DataLoader workers), RSS and USS from
/proc/PID/smaps_rollup (mpviz/memory_cgroup.py: RSS counts shared pages too, USS only the
private ones), and the cgroup's charge. Without a cgroup (not root, no memory controller), the
limit is a STAND-IN: this watcher SIGKILLs the largest worker once the workers' growth since they
started passes the limit, and every verdict says so -- the kernel killed nothing then.
"""
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from glob import glob

from ..memory_cgroup import (charged, make_cgroup, memory, oom_kills, play_oom_killer,
                             remove_cgroup)
from ..viz.figure import Figure
from ..viz.rss import memory_lines
from .your_program import PROGRAMS, ROOT

SAMPLE_SECONDS = 0.05
MIB = 1 << 20


@dataclass
class WatchedRun:
    """One watched run: what it printed, its workers, their memory samples, the limit's story."""
    command: list
    status: int
    output: str
    messages: str                 # stderr: torch's traceback, if any
    workers: dict                 # {worker id: pid}, as the workers printed it
    samples: dict                 # {pid: [(seconds, rss, uss), ...]}
    charge: list                  # [(seconds, bytes)]: charged to the cgroup, or the stand-in's
                                  # sum of the workers' growth (no limit: empty)
    limit_mb: int = None
    where: str = None             # "cgroup", "stand-in" or None (no limit)
    cgroup_version: str = None
    why_no_cgroup: str = ""
    oom_kills: int = None         # the kernel's count, cgroup only
    killed_by_watcher: int = None  # pid the stand-in killed
    cgroup_removed: bool = None
    left_in_shm: list = field(default_factory=list)   # [(name, bytes)] a killed worker left

    def show(self):
        print("$", " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else
                            ("python" if a == sys.executable else a) for a in self.command))
        if self.where == "cgroup":
            print(f"(each worker joined a memory cgroup of {self.limit_mb} MiB, cgroup "
                  f"{self.cgroup_version}: the kernel enforces it)")
        elif self.where == "stand-in":
            print(f"(STAND-IN LIMIT: no memory cgroup was made here ({self.why_no_cgroup}); "
                  f"mpviz's watcher SIGKILLs the largest worker once the workers have grown "
                  f"{self.limit_mb} MiB together. Any kill below is mpviz's, not the kernel's.)")
        print(self.output.rstrip())
        errors = [line.rstrip() for line in self.messages.splitlines()
                  if re.match(r"\w+(Error|Exception): ", line)]
        if errors:
            print("the traceback's error lines (first to last):", *errors, sep="\n")
        elif self.status:
            print("\n".join(self.messages.rstrip().splitlines()[-3:]))
        for name, size in self.left_in_shm:
            print(f"(left behind by a killed worker and removed by mpviz: /dev/shm/{name}, "
                  f"{size:,} bytes)")
        print(f"exit status: {self.status}")

    def loader(self):
        """Whose DataLoader ran: the program's first line says ("torch 2.13.0+cpu's")."""
        found = re.search(r"^DataLoader: (.*)$", self.output, re.M)
        return f"DataLoader ({found.group(1)})" if found else "DataLoader"

    def name(self, pid):
        return next((f"worker {w}" for w, p in self.workers.items() if p == pid), f"pid {pid}")

    def picture(self, what="rss", ax=None, title=None):
        """Each worker's `what` ("rss" or "uss") over time; with a limit, the cgroup's charge
        (or the stand-in's sum of growth) against it. Returns the Figure."""
        column = {"rss": 1, "uss": 2}[what]
        killed = self.killed()
        lines = []
        for pid in sorted(self.samples, key=self.name):
            points = self.samples[pid]
            lines.append((f"{self.name(pid)} (pid {pid})", [p[0] for p in points],
                          [p[column] / MIB for p in points],
                          (killed[1], self.name(pid)) if killed and killed[0] == pid else None,
                          "-"))
        if self.charge:
            lines.append(("charged to the cgroup (all workers)" if self.where == "cgroup" else
                          "grown since start (all workers): what a cgroup would charge",
                          [c[0] for c in self.charge], [c[1] / MIB for c in self.charge],
                          None, ":"))
        what_is = {"rss": "resident memory, VmRSS (MiB)", "uss": "private memory, USS (MiB)"}
        if title is None and self.where == "stand-in":
            title = (f"STAND-IN limit (no memory cgroup here): mpviz's watcher, not the kernel,\n"
                     f"SIGKILLs the largest worker at {self.limit_mb} MiB of growth")
        elif title is None and self.where == "cgroup":
            title = (f"Each worker's resident memory, and what the kernel charges to their memory "
                     f"cgroup (limit {self.limit_mb} MiB)")
        return memory_lines(lines, ax=ax, limit_mb=self.limit_mb, title=title,
                            ylabel=what_is[what], xlabel="seconds since the program started",
                            first_under=True)

    def killed(self):
        """(pid, signal name) of the worker the DataLoader says was killed (torch's words, or
        mpviz's, which are the same), else the one the stand-in killed, else None. When torch's
        SIGCHLD handler misses the death, torch notices it at its next 5 s check and says only
        "pid(s) N exited unexpectedly": under a cgroup whose OOM killer killed, that is N."""
        found = re.search(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.+?)\.?\s*$",
                          self.messages, re.M)
        if found:
            return int(found.group(1)), _signal_name(found.group(2))
        gone = re.search(r"DataLoader worker \(pid\(s\) (\d+)[\d, ]*\) exited unexpectedly",
                         self.messages)
        if gone and self.where == "cgroup" and self.oom_kills:
            return int(gone.group(1)), "SIGKILL"
        if self.killed_by_watcher:
            return self.killed_by_watcher, "SIGKILL"
        return None


def _signal_name(description):
    """strsignal's words ("Killed") as a name ("SIGKILL")."""
    for sig in signal.Signals:
        if signal.strsignal(sig) == description:
            return sig.name
    return description


def _children(pid):
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def _reader(stream, into):
    for line in stream:
        into.append(line)


def watch(what, *args, limit_mb=None, limit="auto", timeout=120):
    """Run ``dataloader_memory.py what *args`` and watch its workers (see the top).

    `limit_mb`: a memory limit for the workers together; `limit`: "auto" (a real cgroup where
    one can be made, else the stand-in), "cgroup" (or raise) or "stand-in"."""
    if limit not in ("auto", "cgroup", "stand-in"):
        raise ValueError(f"limit={limit!r}: not a way to limit memory. Fix: 'auto', 'cgroup' or "
                         f"'stand-in'")
    command = [sys.executable, os.path.join(PROGRAMS, "dataloader_memory.py"), what,
               *map(str, args)]
    cgroup = version = None
    why = "not tried: limit='stand-in' was asked for" if limit == "stand-in" else ""
    if limit_mb is not None and limit != "stand-in":
        try:
            cgroup, version = make_cgroup(limit_mb * MIB)
        except OSError as exc:
            why = str(exc) or type(exc).__name__
            if limit == "cgroup":
                raise RuntimeError(f"limit='cgroup' cannot run here: {why}. Fix: run as root "
                                   f"with a memory controller mounted, or limit='stand-in'")
        if cgroup:
            command += ["--join", os.path.join(cgroup, "cgroup.procs")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    out, err = [], []
    samples, base, charge = {}, {}, []
    killed_by_watcher = None
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=ROOT, start_new_session=True)
    readers = [threading.Thread(target=_reader, args=(s, into), daemon=True)
               for s, into in ((child.stdout, out), (child.stderr, err))]
    for r in readers:
        r.start()
    t0, started = time.monotonic(), time.time()
    try:
        while child.poll() is None:
            now = time.monotonic() - t0
            if now > timeout:
                raise subprocess.TimeoutExpired(command, timeout)
            rss_now = {}
            for pid in _children(child.pid):
                used = memory(pid)
                if used is None:
                    continue
                samples.setdefault(pid, []).append((now, *used))
                base.setdefault(pid, used[0])
                rss_now[pid] = used[0]
            if cgroup:
                used = charged(cgroup, version)
                if used is not None:
                    charge.append((now, used))
            elif limit_mb is not None and samples:
                charge.append((now, sum(max(0, v - base[p]) for p, v in rss_now.items())))
                if killed_by_watcher is None:
                    killed_by_watcher = play_oom_killer(rss_now, base, limit_mb * MIB)
            time.sleep(SAMPLE_SECONDS)          # sampling: a reading every 50 ms, bounded above
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)     # its workers too, if any are left
        except ProcessLookupError:
            pass
        child.wait()
        for r in readers:
            r.join(timeout=5)
    run = WatchedRun(command, child.returncode, "".join(out), "".join(err),
                     {int(w): int(p) for w, p in re.findall(r"^worker (\d+) pid (\d+)$",
                                                            "".join(out), re.M)},
                     samples, charge, limit_mb,
                     "cgroup" if cgroup else ("stand-in" if limit_mb is not None else None),
                     version, why, killed_by_watcher=killed_by_watcher)
    if cgroup:
        run.oom_kills = oom_kills(cgroup, version)
        run.cgroup_removed = remove_cgroup(cgroup)
    run.left_in_shm = _remove_shm_of(samples, since=started)
    return run


def _remove_shm_of(pids, since):
    """Remove /dev/shm/torch_PID_* of the (dead) workers `pids`, made after `since` (time.time()):
    [(name, bytes)] removed.

    torch's file_descriptor strategy shm_open()s a name for each batch's storage and unlinks it
    at once; a worker SIGKILLed in between (the OOM killer strikes at an allocation) leaves the
    name behind, and nothing ever removes it."""
    removed = []
    for pid in pids:
        for path in glob(f"/dev/shm/torch_{pid}_*"):
            try:
                info = os.lstat(path)
                if info.st_mtime < since:
                    continue                    # an older file of the same pid: not this run's
                os.unlink(path)         # a name, not followed: a planted symlink is only unlinked
            except OSError:
                continue
            removed.append((os.path.basename(path), info.st_size))
    return removed


# -- verdicts: from what was measured -----------------------------------------------------------

def _peak(run, pid, column=1):
    return max((p[column] for p in run.samples.get(pid, [])), default=0)


def oom_verdict(run):
    """("error" or "ok", what happened) for a run of ``cache`` under a limit."""
    killed = run.killed()
    if killed is None:
        if run.status != 0:
            return "error", (f"The program failed (exit {run.status}) but no worker was killed "
                             f"by a signal: {run.messages.strip().splitlines()[-1:]}")
        top = max((c for _, c in run.charge), default=0) / MIB
        peaks = ", ".join(f"{run.name(pid)} {_peak(run, pid) / MIB:.0f} MiB"
                          for pid in sorted(run.samples, key=run.name))
        return "ok", (f"Every worker finished within the {run.limit_mb} MiB limit (peak resident "
                      f"memory: {peaks}; at most {top:.0f} MiB charged to the limit).")
    pid, sig = killed
    raised = [r.strip() for r in re.findall(r"^RuntimeError: (.*)$", run.messages, re.M)]
    last = run.samples[pid][-1][0] if run.samples.get(pid) else None
    at_kill = {p: max((s[1] for s in points if s[0] <= last), default=0)
               for p, points in run.samples.items()} if last is not None else {}
    sizes = ", ".join(f"{run.name(p)} {v / MIB:.0f} MiB" for p, v in
                      sorted(at_kill.items(), key=lambda item: run.name(item[0])))
    gap = (max(at_kill.values(), default=0) - at_kill.get(pid, 0)) / MIB
    largest = ("the only worker" if len(at_kill) == 1 else "the largest" if gap <= 0 else
               f"within {math.ceil(gap)} MiB of the largest (they grew together, and the reading "
               f"is up to {SAMPLE_SECONDS * 1000:.0f} ms older than the kill)")
    more = ""
    if run.where == "cgroup" and (run.oom_kills or 0) > 1:     # the cgroup still full: see below
        gone = re.search(r"pid\(s\) ([\d, ]+)\) exited unexpectedly", run.messages)
        also = [run.name(int(p)) for p in (gone.group(1).split(", ") if gone else [])
                if int(p) != pid]
        more = (f" It was not the only one: the cgroup's oom_kill count is {run.oom_kills}, so "
                f"the kernel killed {run.oom_kills - 1} more of the workers after it, before "
                f"torch had shut them down" + (f" (torch names {', '.join(also)} too)." if also
                                               else " (torch names only the first, the one it "
                                                    "saw gone)."))
    if run.where == "cgroup":
        who = (f"The kernel's OOM killer: the workers' memory cgroup (cgroup {run.cgroup_version})"
               f" of {run.limit_mb} MiB was full (its oom_kill count: {run.oom_kills}), and it "
               f"kills the process of the cgroup that uses the most memory")
    else:
        who = (f"STAND-IN, not the kernel: no memory cgroup was made here "
               f"({run.why_no_cgroup}), so mpviz's watcher SIGKILLed the largest worker once the "
               f"workers had grown {run.limit_mb} MiB together, as the OOM killer would")
    log = "" if run.where == "cgroup" else " (here it has nothing: the kill was mpviz's)"
    return "error", (
        f"{run.name(pid)} (pid {pid}) was killed by {sig}: no exception, no traceback of its "
        f"own. {who}. At the last reading before the kill, resident memory was {sizes}: "
        f"{run.name(pid)} was {largest}.{more} The main process's {run.loader()} said: "
        f"{' / '.join(raised) or '(nothing)'}. Cause: each worker keeps every image it decodes "
        f"in its own self.cache (8 MiB each), so the workers together outgrow the limit. Fix: "
        f"no cache in the workers (cache_items=0), or a small one (cache_items x 8 MiB x "
        f"num_workers well under the limit), or a larger limit; after a kernel's SIGKILL, its "
        f"log (dmesg: 'Memory cgroup out of memory: Killed process N') names the cause"
        f"{log}.")


def cow_growth(run):
    """{worker id: {"uss0", "uss", "rss0", "rss" (bytes: first and peak), "grew" (uss - uss0)}}."""
    found = {}
    for w, pid in sorted(run.workers.items()):
        points = run.samples.get(pid)
        if points:
            uss0, rss0 = points[0][2], points[0][1]
            uss, rss = _peak(run, pid, 2), _peak(run, pid, 1)
            found[w] = dict(uss0=uss0, uss=uss, rss0=rss0, rss=rss, grew=uss - uss0)
    return found


def cow_picture(list_run, array_run):
    """Four panels: RSS (top) and USS (bottom) of each worker, the list's run left, the arrays'
    right; each row on one scale. Returns the Figure."""
    fig = Figure(figsize=(11, 6), layout="constrained")
    axes = fig.subplots(2, 2, sharey="row")
    for column, (run, name) in enumerate(((list_run, "a list of tuples"),
                                          (array_run, "NumPy arrays"))):
        run.picture("rss", ax=axes[0][column],
                    title=f"{name}: resident memory (RSS: shared pages count too)")
        run.picture("uss", ax=axes[1][column],
                    title=f"{name}: private memory (USS: this worker's own pages)")
    return fig


def cow_summary(run, label):
    """One sentence per run, every number from `run`'s samples."""
    parts = [f"worker {w}: private {g['uss0'] / MIB:.0f} -> {g['uss'] / MIB:.0f} MiB "
             f"(+{g['grew'] / MIB:.0f}), resident {g['rss0'] / MIB:.0f} -> {g['rss'] / MIB:.0f}"
             f" MiB" for w, g in cow_growth(run).items()]
    return f"{label}: " + "; ".join(parts) + "."
