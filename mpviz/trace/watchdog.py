"""The hang watchdog of ``python -m mpviz trace --hang-after S`` and ``record(hang_after=S)``.

A scenario's watchdog (scenarios/runner.py) does this for the workshop's cases; this module does
the same for the learner's own program, and reuses that file's helpers (processes of a session,
their CPU time, stack summaries)::

    every 0.1 s:  new events in the trace directory?  the watched processes used CPU?  → progress
                  no progress for `hang_after` seconds                                → a hang

    a hang:   SIGUSR1 to each recorded process still running; faulthandler (registered in every
              process at start-up by ``autostart.register_stacks``) writes its threads' Python
              stacks to DIR/.stacks/PID.txt
              the caller ends the processes (the launcher: the program's whole session)
              the stacks become ``watchdog.stuck`` events (the pictures mark those lanes stuck)
              ``verdict()``: the same in words -- how long nothing happened, where each process
              was, and who waits for whom as far as the trace recorded it

"Progress" is what the trace can see: an event, or CPU time. A program that sleeps longer than
`hang_after` without recording anything looks the same as one that is stuck, which is why the
verdict says what was seen and shows the stacks, and why ``--hang-after 0`` turns this off.
"""
import os
import signal
import time

from . import recorder
from .trace import Trace

POLL_SECONDS = 0.1
CPU_PROGRESS_SECONDS = 0.25   # this much CPU used by the watched processes = progress
STACKS = ".stacks"            # the folder in the trace directory where the stacks go
HANG_EXIT_STATUS = 124        # what `timeout` returns when it had to stop its command


class Watchdog:
    """Watches a trace directory and a set of processes; ``poll()`` says when they are stuck.

    `pids()`: the processes to watch, asked at every poll (the launcher: the program's session;
    ``record()``: this process's descendants).
    """

    def __init__(self, directory, hang_after, pids):
        from ..scenarios import runner
        self._runner = runner
        self.directory, self.hang_after, self.pids = directory, float(hang_after), pids
        self.stacks_dir = os.path.join(directory, STACKS)
        os.makedirs(self.stacks_dir, exist_ok=True)
        self.trace = Trace(directory)       # live: refreshed at every poll, complete at the end
        self.last_progress = time.monotonic()
        self.cpu_mark = self._cpu()
        self.stalled_for = 0.0

    def _cpu(self):
        total = 0.0
        for pid in self.pids():
            st = self._runner._stat(pid)
            if st is not None:
                total += st[3]
        return total

    def poll(self):
        """Look once: True when nothing has progressed for `hang_after` seconds."""
        try:
            new = self.trace.refresh()
        except Exception:         # a log being created right now; the next poll reads it
            new = 0
        now, cpu = time.monotonic(), self._cpu()
        if new or cpu - self.cpu_mark > CPU_PROGRESS_SECONDS:
            self.last_progress, self.cpu_mark = now, cpu
        self.stalled_for = now - self.last_progress
        return self.stalled_for > self.hang_after

    def capture_stacks(self, extra=None):
        """``{pid: {"name", "stacks"}}`` of every recorded process still running, asked with
        SIGUSR1 (the runner's way: faulthandler answers even while a thread is blocked).
        `extra`: ``{pid: text}`` stacks already known (this process's own, in ``record()``)."""
        names = labels(self.trace)
        pids = [pid for pid in self.pids() if pid in names and pid not in (extra or {})]
        out = self._runner.capture_stacks(pids, names, self.stacks_dir)
        for pid, text in (extra or {}).items():
            out[pid] = {"name": names.get(pid), "stacks": text}
        return out

    def record_verdict(self, stacks, killed):
        """Write the stacks as ``watchdog.stuck`` events and the kill as ``watchdog.kill``
        (a log of the watchdog's own, merged into the trace like any process's)."""
        try:
            log = recorder.SideLog(self.directory, "watchdog")
        except OSError:
            return
        try:
            for pid, info in stacks.items():
                log.emit("watchdog.stuck", pid=pid, name=info["name"], stacks=info["stacks"],
                         reason="stuck", seconds=round(self.stalled_for, 2))
            log.emit("watchdog.kill", pids=list(killed), reason="stuck")
        finally:
            log.close()

    def verdict(self, stacks, killed):
        """The hang in words: what was seen, where each process was, who waits for whom."""
        lines = [f"mpviz trace: HANG: no process made progress for {self.stalled_for:.1f} s (no event "
                 f"recorded, no CPU used), so mpviz stopped "
                 f"{len(killed)} process(es) with SIGKILL.",
                 "Where each process was (Python stacks captured before they were killed, "
                 "innermost call first):",
                 self._runner._stack_summary(stacks)]
        lines += waits_in_words(self.trace)
        return "\n".join(lines)


def waits_in_words(trace):
    """Who waits for whom when the run got stuck, as far as the trace recorded it."""
    try:
        from mpviz.viz import state as st
    except ImportError:            # no matplotlib: mpviz.viz cannot be imported
        return ["(The wait-for graph needs mpviz.viz, which needs matplotlib.)"]
    at = st.stuck_moment(trace)
    state = st.state_at(trace, at)
    lines = []
    for lk in state.locks:
        owners = ", ".join(f"{state.labels.get(o.pid, o.pid)}'s {o.thread}"
                           + (f" ({o.ghost})" if o.ghost else "") for o in lk.owners)
        for pid, tid, since in lk.waiters:
            who = f"{state.labels.get(pid, pid)}'s {state.thread_names.get((pid, tid), tid)}"
            lines.append(f"  {who} waits for {lk.type or 'lock'} {lk.id}"
                         + (f", held by {owners}" if owners else ", which nobody holds"))
    for d in state.deadlocks:
        if d.cycle or "watchdog" not in d.reason:
            lines.append(f"  STUCK FOR GOOD: {d.reason}")
    if not lines:
        return ["Who waits for whom: the trace recorded no wait that was still open (read the "
                "stacks above: the innermost call is where each thread waits)."]
    return ["Who waits for whom (recorded waits still open when it stopped):"] + lines


def labels(trace):
    """``{pid: name}`` for messages: a traced program by its script, others by their name."""
    out = {}
    for p in trace.processes():
        out[p.pid] = program_name(trace, p.pid) or p.name
    return out


def program_name(trace, pid):
    """The script a traced program ran (``prog.py``, ``-m pkg``, ``-c``), from its argv."""
    for e in trace.events:
        if e.pid == pid and e.kind == "process.start":
            if e.args.get("how") != "exec":
                return None
            argv = e.args.get("argv") or []
            if not argv or not argv[0]:
                return None
            return "python -c" if argv[0] == "-c" else os.path.basename(str(argv[0]))
    return None


def kill_descendants(root):
    """SIGKILL every living descendant of `root` (not `root`); return their pids."""
    from ..scenarios.runner import _stat
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st is not None and st[0] != "Z":
                children.setdefault(st[1], []).append(int(entry))
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found
