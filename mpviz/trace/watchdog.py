"""The hang watchdog of ``python -m mpviz trace --hang-after S`` and ``record(hang_after=S)``.

A scenario's watchdog (scenarios/runner.py) does this for the workshop's cases; this module does
the same for the learner's own program, and reuses that file's helpers (processes of a session,
their CPU time, asking them for their stacks)::

    every 0.1 s:  new events in the trace directory?  the watched processes used CPU?  → progress
                  no progress for `hang_after` seconds                                → a hang

    a hang:   SIGUSR1 to each recorded process still running; faulthandler (registered in every
              process at start-up by ``autostart.register_stacks``) writes its threads' Python
              stacks to DIR/.stacks/PID.txt
              the caller ends the processes (the launcher: the program's whole session;
              ``record()``: the block's children, see ``Guard``)
              the stacks become ``watchdog.stuck`` events (the pictures mark those lanes stuck)
              ``verdict()``: the same in words -- how long nothing happened, where each process
              was, and who waits for whom as far as the trace recorded it

"Progress" is what the trace can see: an event, or CPU time. A process whose main thread sleeps
(``time.sleep``) or reads from a terminal (``input()``) is waiting for time or for you, not
stuck: that counts as progress too (seen in /proc: the system call it is blocked in). Anything
else that waits longer than `hang_after` without recording an event looks the same as a hang --
a slow network read, say -- which is why the verdict says what was seen and shows the stacks,
and why ``--hang-after 0`` turns this off.
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
    ``record()``: this process's descendants). `cpu()`: their CPU seconds so far (default: summed
    over `pids()` from /proc).
    """

    def __init__(self, directory, hang_after, pids, cpu=None):
        from ..scenarios import runner
        self._runner = runner
        self.directory, self.hang_after, self.pids = directory, float(hang_after), pids
        self.stacks_dir = os.path.join(directory, STACKS)
        os.makedirs(self.stacks_dir, exist_ok=True)
        self.trace = Trace(directory)       # live: refreshed at every poll, complete at the end
        self._cpu = cpu or self._cpu_of_pids
        self.last_progress = time.monotonic()
        self.cpu_mark = self._cpu()
        self.stalled_for = 0.0

    def _cpu_of_pids(self):
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
        if self.stalled_for > self.hang_after and self._waiting_for_time_or_user():
            self.last_progress = now                      # not stuck: asleep, or asking you
            self.stalled_for = 0.0
        return self.stalled_for > self.hang_after

    def _waiting_for_time_or_user(self):
        """True if a watched process's main thread sleeps (``time.sleep``) or reads from a
        terminal (``input()``): its wait ends by itself, or when you type -- not a hang."""
        return any(waits_for_time_or_user(pid, pid) for pid in self.pids())

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
            recorded = {p.pid for p in self.trace.processes()}
            for pid in killed:       # how they ended, for the pictures: not "still running"
                if pid in recorded:
                    log.emit("process.reaped", child=pid, exitcode=-signal.SIGKILL,
                             signal="SIGKILL", by="watchdog")
        finally:
            log.close()

    def verdict(self, stacks, killed):
        """The hang in words: what was seen, where each process was, who waits for whom."""
        lines = [f"mpviz trace: HANG: no process made progress for {self.stalled_for:.1f} s "
                 f"(no event recorded, no CPU used), so mpviz stopped "
                 f"{len(killed)} process(es) with SIGKILL.",
                 "Where each process was (Python stacks captured before they were killed, "
                 "innermost call first; ... leads to the program's own line):",
                 stack_summary(stacks)]
        lines += waits_in_words(self.trace)
        return "\n".join(lines)


def stack_summary(stacks, frames=3):
    """Each process's threads, one line each: the innermost `frames` calls and, if they are
    all in the stdlib or mpviz, the innermost call in the program's own code (the line to
    read first). The whole stacks are in the trace (``watchdog.stuck`` events)."""
    if not stacks:
        return "  (no stacks: the processes had already exited)"
    lines = []
    for pid, info in stacks.items():
        lines.append(f"  pid {pid} ({info['name'] or '?'}):")
        threads = parse_stacks(info["stacks"])
        if not threads:
            lines.append(f"    {info['stacks'].strip()[:200]}")
        for thread, calls in threads:
            shown = [call for call, _ in calls[:frames]]
            own = next((call for call, mine in calls[frames:] if mine), None)
            if own:
                shown.append(f"... {own}")
            elif len(calls) > frames:
                shown.append("...")
            lines.append(f"    {thread}: {' <- '.join(shown) or '(no Python frames)'}")
    return "\n".join(lines)


def parse_stacks(text):
    """faulthandler's text as [(thread label, [("fn (file.py:line)", in the program?)])]."""
    import sysconfig
    library = tuple(os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"],
                                                  sysconfig.get_paths()["purelib"],
                                                  sysconfig.get_paths()["platlib"]})
    mpviz_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    threads = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif line.startswith("File ") and threads:
            try:
                path, rest = line[6:].split('", line ', 1)
                lineno, fn = rest.split(" in ", 1)
            except ValueError:
                threads[-1].append((line, False))
                continue
            real = os.path.realpath(path)
            mine = not real.startswith(library + (mpviz_dir,)) and not path.startswith("<")
            threads[-1].append((f"{fn} ({os.path.basename(path)}:{lineno})", mine))
    # faulthandler does not say which thread is the main one: the others began in threading's
    # Thread._bootstrap
    return [("thread" if calls and calls[-1][0].startswith("_bootstrap (threading.py") else
             "main thread", calls) for calls in threads]


# System call numbers, by machine, of the waits that end by themselves or by the user's typing
# (see syscall(2) and /proc/PID/task/TID/syscall in proc(5)): "sleep" and "read".
_SLEEPS = {"x86_64": {35, 230}, "aarch64": {101, 115}}
_READ = {"x86_64": 0, "aarch64": 63}


def waits_for_time_or_user(pid, tid):
    """Is thread `tid` of process `pid` in a sleep, or reading a terminal? (Linux: the system
    call it is blocked in, from /proc; False where that cannot be read.)"""
    machine = os.uname().machine
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    if not fields or not fields[0].isdigit() or machine not in _SLEEPS:
        return False                        # running, or not in a system call
    number = int(fields[0])
    if number in _SLEEPS[machine]:
        return True
    if number == _READ[machine] and len(fields) > 1:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{int(fields[1], 16)}")
        except (OSError, ValueError):
            return False
        return target.startswith(("/dev/pts/", "/dev/tty"))
    return False


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
    for b in state.blocked:       # joins, q.join, a full pipe, Events ... (waits.py)
        lines.append(f"  {_thread_words(state, b.pid, b.tid)} waits: {b.what} -- "
                     f"{_who_must_act(state, b)}")
    for d in state.deadlocks:
        if d.cycle or "watchdog" not in d.reason:
            lines.append(f"  STUCK FOR GOOD: {d.reason}")
    if not lines:
        return ["Who waits for whom: the trace recorded no wait that was still open (read the "
                "stacks above: the innermost call is where each thread waits)."]
    return ["Who waits for whom (recorded waits still open when it stopped):"] + lines


def _thread_words(state, pid, tid):
    return f"{state.labels.get(pid, pid)}'s {state.thread_names.get((pid, tid), f'thread {tid}')}"


def _who_must_act(state, blocked):
    """The end of a wait's line: who must act, as the wait-for graph's arrows say it."""
    from mpviz.viz.wait_for import MUST
    if blocked.waits_for:
        who = " or ".join(_thread_words(state, pid, tid) for pid, tid in blocked.waits_for)
        alive = {(p.pid, tid) for p in state.processes for tid, _ in p.threads}
        ended = not any(w in alive for w in blocked.waits_for)   # (the graph says "(ended)")
        return f"{who} {MUST.get(blocked.on, 'must act')}" + (
            f" -- but {'it has' if len(blocked.waits_for) == 1 else 'they have'} ended"
            if ended else "")
    name = state.channel_names.get(blocked.target, blocked.target)
    if blocked.on == "pipe.write":
        return f"someone must read {name}, and nobody has read it yet"
    if blocked.on == "queue.put":
        return f"someone must get from {name}, and nobody has got from it yet"
    if blocked.on == "queue.get":
        return f"someone must put into {name}, and nobody has put into it yet"
    return "who must act is not recorded"


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


def kill_descendants(root, recorded=()):
    """SIGKILL every living descendant of `root` (not `root`) but the helpers it shares with
    later runs (its resource tracker, fork server, mpviz's shm manager: they record nothing,
    and are known by their command line -- which a fork server's children share, so a
    `recorded` pid is killed whatever its command line); return their pids."""
    found = [pid for pid in descendants(root) if pid in recorded or not _shared_helper(pid)]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


# --- record(hang_after=S): the same, inside one process (a notebook's kernel) ----------------

class HangError(RuntimeError):
    """Raised by ``record(hang_after=S)`` when nothing progressed for S seconds: the watchdog
    captured every process's stacks, ended the processes started in the block and stopped it.
    ``verdict``: the same text it printed; ``path``: the trace directory (the trace you named
    in ``with record(...) as trace`` holds the events, ``watchdog.stuck`` ones included)."""

    def __init__(self, verdict, path=None):
        super().__init__(verdict)
        self.verdict, self.path = verdict, path

    def __reduce__(self):
        return (HangError, (self.verdict, self.path))


class Guard:
    """The watchdog of one ``record(hang_after=S)`` block, in a thread of this process.

    Watched: this process's children and their descendants (by parent pid in /proc), and this
    process's own threads (their CPU time, from /proc/self/task, the guard's own excluded).
    Stuck: stacks (SIGUSR1 to the children; faulthandler for this process), SIGKILL to the
    descendants, the verdict on stderr; if the block still does not end within a second, a
    SIGINT to the thread that entered it, and ``record`` raises ``HangError`` at its end.

    A process started with SIGINT ignored (``nohup python x.py &``: a shell starts background
    jobs so) or set to its default action (killed by it) would not be woken, or would die: for
    the block, SIGINT then gets a handler of the guard's, which raises KeyboardInterrupt only
    for the guard's own SIGINT and otherwise does what was set before.
    """

    def __init__(self, directory, hang_after):
        import threading
        self._owner = threading.get_ident()
        self._old_env = os.environ.get(_env_stacks())
        self._tid = None
        self.watchdog = Watchdog(directory, hang_after, self._pids, cpu=self._cpu)
        os.environ[_env_stacks()] = self.watchdog.stacks_dir   # spawned children show stacks
        _fork_children_show_stacks()
        self.verdict, self._done = None, threading.Event()
        self._old_sigint = self._take_sigint()
        self._thread = threading.Thread(target=self._watch, name="mpviz-hang-watchdog",
                                        daemon=True)
        self._thread.start()

    def _take_sigint(self):
        """SIGINT's handler before, when the guard replaced it (ignored, or the default action:
        neither would end the block); None when it was left as it was."""
        import signal
        import threading
        if threading.get_ident() != threading.main_thread().ident:
            return None                      # (only the main thread sets handlers or is woken)
        old = signal.getsignal(signal.SIGINT)
        if old not in (signal.SIG_IGN, signal.SIG_DFL):
            return None                      # Python's KeyboardInterrupt, or the program's own
        signal.signal(signal.SIGINT, self._on_sigint)
        return old

    def _on_sigint(self, signum, frame):
        import signal
        if self.verdict is not None:
            raise KeyboardInterrupt          # the guard's own: end the block
        if self._old_sigint == signal.SIG_DFL:       # someone else's, as before the block
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    def _pids(self):
        return [os.getpid()] + descendants(os.getpid())

    def _watch(self):
        import threading
        self._tid = threading.get_native_id()
        self.watchdog.cpu_mark = self._cpu()       # now without this thread's own
        while not self._done.wait(POLL_SECONDS):
            if self.watchdog.poll():
                self._fire()
                return

    def _cpu(self):
        """CPU seconds of the children and of this process's threads but this one."""
        from ..scenarios.runner import _stat as stat
        total = sum(st[3] for st in map(stat, descendants(os.getpid())) if st is not None)
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            tasks = []
        for tid in tasks:
            if int(tid) != self._tid:
                st = stat(f"self/task/{tid}")
                total += st[3] if st is not None else 0.0
        return total

    def _fire(self):
        import faulthandler
        import threading
        import sys
        mine = os.path.join(self.watchdog.stacks_dir, f"{os.getpid()}.self.txt")
        with open(mine, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        with open(mine) as f:
            own = f.read().strip()
        own = "\n".join(block for block in own.split("\n\n") if "_fire" not in block) or own
        stacks = self.watchdog.capture_stacks(extra={os.getpid(): own})
        killed = kill_descendants(os.getpid(), {p.pid for p in self.watchdog.trace.processes()})
        self.watchdog.record_verdict(stacks, killed)
        self.watchdog.trace.refresh()
        self.verdict = self.watchdog.verdict(stacks, killed).replace("mpviz trace: ", "mpviz: ")
        print(self.verdict, file=sys.stderr, flush=True)
        if not self._done.wait(1.0) and self._owner == threading.main_thread().ident:
            import signal as _signal
            _signal.pthread_kill(self._owner, _signal.SIGINT)   # wake a wait in the block

    def stop(self):
        """The block has ended: stop watching; give the environment back."""
        self._done.set()
        self._thread.join()
        if self._old_sigint is not None:
            import signal
            signal.signal(signal.SIGINT, self._old_sigint)
        if self._old_env is None:
            os.environ.pop(_env_stacks(), None)
        else:
            os.environ[_env_stacks()] = self._old_env


def _env_stacks():
    from .autostart import ENV_STACKS
    return ENV_STACKS


_fork_hook = False


def _fork_children_show_stacks():
    """A forked child of a guarded block registers its stacks (once per process: at-fork hooks
    cannot be removed; outside a guarded block the variable is unset and it does nothing)."""
    global _fork_hook
    if not _fork_hook:
        from . import autostart
        os.register_at_fork(after_in_child=lambda: os.environ.get(_env_stacks())
                            and autostart.register_stacks())
        _fork_hook = True


def _shared_helper(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return any(word in cmdline for word in (b"resource_tracker", b"forkserver",
                                            b"shm_manager"))


def descendants(root):
    """Living (not zombie) descendants of process `root`, by parent pid in /proc."""
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
    return found
