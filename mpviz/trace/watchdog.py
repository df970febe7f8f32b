"""The hang watchdog of ``python -m mpviz trace --hang-after S`` and ``record(hang_after=S)``.

A scenario's watchdog (scenarios/runner.py) does this for the workshop's cases; this module does
the same for the learner's own program, and reuses that file's helpers (processes of a session,
asking them for their stacks). Hangs are judged by what each thread waits on, not by silence:

    every 0.1 s, each thread of each watched process (osview.threads: /proc/PID/task/TID):
        it ran (its run count moved: a wait of it ended), or used CPU     → it moved
        it waits with a deadline: time.sleep(t), get(timeout=t), select   → it moves when that
                                                                             wait ends (a loop
              that waits again on the same lock or fd with no work between is one long wait)
        it waits for ever: a lock with no timeout, a read on a pipe, join → only another
                                                                             thread can end it
        it reads a terminal (input())                                     → it waits for you:
                                                                             never a hang
    DEADLOCK, one process:  every thread of it has waited for `hang_after` s, with no time
                            limit, on a lock of its own memory (a private futex) -- only a
                            thread of that same process could release it, and none can. It
                            can never move, whatever other processes (or CPU use) do.
    DEADLOCK, everyone:     no thread of any process moved (and no event was recorded) for
                            `hang_after` s, and every one waits for ever: nobody can ever move.
    STALLED:                the same, but some threads wait with a deadline longer than
                            `hang_after` (a sleep of an hour, a get(timeout=60)): they would
                            move one day, later than you said you would wait.

    a hang:   SIGUSR1 to each recorded process still running; faulthandler (registered in every
              process at start-up by ``autostart.register_stacks``) writes its threads' Python
              stacks to DIR/.stacks/PID.txt
              the caller ends the processes (the launcher: the program's whole session;
              ``record()``: the block's children, see ``Guard``)
              the stacks become ``watchdog.stuck`` events (the pictures mark those lanes stuck)
              ``verdict()``: the same in words -- the kind of hang, where each thread was and
              what it waits on (stuck.py), and who waits for whom as far as the trace recorded it

A wait on something outside the program (a slow network read) looks the same as a hang, which is
why the verdict says what was seen and shows the stacks, and why ``--hang-after 0`` turns this
off. Below MIN_HANG_AFTER the watchdog refuses: it judges a thread by what it did between two
looks, 0.1 s apart, and needs several looks (and a program time to start) before "nothing moved"
means anything.
"""
import math
import os
import signal
import time

from . import osview, recorder
from .trace import Trace

POLL_SECONDS = 0.1
MIN_HANG_AFTER = 0.5          # seconds: 5 looks; below it, a starting program reads as stuck
MOVE_CPU_NS = 20_000_000      # a thread that used this much CPU since it last moved: it works
STACKS = ".stacks"            # the folder in the trace directory where the stacks go
HANG_EXIT_STATUS = 124        # what `timeout` returns when it had to stop its command


def check_hang_after(value, name="hang_after"):
    """`value` as seconds (float), or 0.0 for "off"; ``ValueError`` saying why otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}. Fix: e.g. "
                         f"{name}=10, or 0 to turn the watchdog off")
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{name} must be 0 (off) or a finite number of seconds >= "
                         f"{MIN_HANG_AFTER}, not {value}. Fix: e.g. 10; 0 turns the watchdog off")
    if 0 < value < MIN_HANG_AFTER:
        raise ValueError(
            f"{name}={value} is too short to judge a hang: the watchdog looks at each thread "
            f"every {POLL_SECONDS} s and needs several looks before 'nothing moved' means "
            f"anything (below {MIN_HANG_AFTER} s a program that is still starting, or busy, "
            f"would be called stuck). Fix: give at least {MIN_HANG_AFTER} s, or 0 to turn it off")
    return float(value)


def _progress(event):
    """Is this recorded event progress? A wait that begins, or ends without what it waited for
    (a timeout), is not: a loop of get(timeout=...) records them and moves nothing."""
    return not (event.kind == "wait.begin" or
                (event.kind == "wait.end" and event.args.get("ok") is False))


class _Seen:
    """What the watchdog last saw of one thread."""
    __slots__ = ("view", "moved", "since", "cpu_since_move")

    def __init__(self, view, now):
        self.view, self.moved, self.since, self.cpu_since_move = view, now, now, 0


class Watchdog:
    """Watches a trace directory and a set of processes; ``poll()`` says when they are stuck.

    `pids()`: the processes to watch, asked at every poll (the launcher: the program's session;
    ``record()``: this process and its descendants). `ignore()`: thread ids not to judge (the
    guard's own thread, in ``record()``).

    After ``poll()`` returned True: ``kind`` ("deadlock" or "stalled"), ``stuck_pids`` (the
    processes that can never move; empty when the whole program stalled), ``stalled_for``.
    """

    def __init__(self, directory, hang_after, pids, ignore=None):
        from ..scenarios import runner
        self._runner = runner
        self.directory, self.pids = directory, pids
        self.hang_after = check_hang_after(hang_after)
        self._ignore = ignore or (lambda: ())
        self.stacks_dir = os.path.join(directory, STACKS)
        os.makedirs(self.stacks_dir, exist_ok=True)
        self.trace = Trace(directory)       # live: refreshed at every poll, complete at the end
        self.last_progress = time.monotonic()
        self.stalled_for = 0.0
        self.seen = {}                      # (pid, tid) -> _Seen
        self.kind, self.stuck_pids, self.facts = None, [], None

    def poll(self):
        """Look once: True when a process can never move, or nothing moved for `hang_after`."""
        try:
            self.trace.refresh()
            new = any(_progress(e) for e in self.trace.last_read)
        except Exception:         # a log being created right now; the next poll reads it
            new = False
        now = time.monotonic()
        moved = self._look(now)
        if new or moved:
            self.last_progress = now
        self.stalled_for = now - self.last_progress
        self.stuck_pids = self._never_moving(now)
        if self.stuck_pids:
            self.kind = "deadlock"
            self.stalled_for = max(now - self.seen[k].moved for k in self.seen
                                   if k[0] in self.stuck_pids)
        elif self.stalled_for > self.hang_after:
            waits = {s.view.wait for s in self.seen.values()}
            self.kind = "stalled" if waits & {"sleep", "deadline"} else "deadlock"
        else:
            return False
        from . import stuck
        self.facts = stuck.Facts(self, now)      # read /proc now: the processes die next
        return True

    def _look(self, now):
        """Read every thread; update what was seen; True if any moved (or came, or went)."""
        ignore = set(self._ignore())
        views, before = {}, {}
        for (pid, tid), s in self.seen.items():
            before.setdefault(pid, {})[tid] = s.view
        for pid in self.pids():
            for view in osview.threads(pid, before.get(pid)):
                if view.tid not in ignore:
                    views[(pid, view.tid)] = view
        moved = set(views) != set(self.seen)          # a thread (or process) started or ended
        seen = {}
        for key, view in views.items():
            old = self.seen.get(key)
            if old is None:
                seen[key] = _Seen(view, now)
                continue
            seen[key] = old
            prev, old.view = old.view, view
            old.cpu_since_move += view.cpu_ns - prev.cpu_ns
            ran = view.runs != prev.runs or view.cpu_ns != prev.cpu_ns
            if view.wait == "terminal" or old.cpu_since_move >= MOVE_CPU_NS or (
                    ran and (view.key != prev.key or prev.wait in ("sleep", "running"))):
                old.moved, old.since, old.cpu_since_move = now, now, 0
                moved = True
        self.seen = seen
        return moved

    def _never_moving(self, now):
        """Processes whose every thread waits for ever on a lock of its own (a private futex),
        for `hang_after` s: none of them can release another. [] when there is none."""
        by_pid = {}
        for (pid, _tid), s in self.seen.items():
            by_pid.setdefault(pid, []).append(s)
        return [pid for pid, threads in by_pid.items()
                if all(s.view.private and now - s.moved > self.hang_after for s in threads)]

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
        """The hang in words: its kind, where each thread was and what it waits on, who waits
        for whom."""
        from . import stuck
        lines = stuck.headline(self, len(killed))
        lines += stuck.threads_in_words(self, stacks)
        lines += ["Python stacks (captured before they were killed, innermost call first; "
                  "... leads to the program's own line):", stack_summary(stacks)]
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

    Watched: this process's threads (the guard's own excluded), its children and their
    descendants (by parent pid in /proc).
    Stuck: stacks (SIGUSR1 to the children; faulthandler for this process), SIGKILL to the
    descendants, the verdict on stderr; if the block still does not end within a second, a
    SIGINT to the thread that entered it, and ``record`` raises ``HangError`` at its end.
    """

    def __init__(self, directory, hang_after):
        import threading
        self._owner = threading.get_ident()
        self._old_env = os.environ.get(_env_stacks())
        self._tid = None
        self.watchdog = Watchdog(directory, hang_after, self._pids, ignore=lambda: {self._tid})
        os.environ[_env_stacks()] = self.watchdog.stacks_dir   # spawned children show stacks
        _fork_children_show_stacks()
        self.verdict, self._done = None, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mpviz-hang-watchdog",
                                        daemon=True)
        self._thread.start()

    def _pids(self):
        return [os.getpid()] + descendants(os.getpid())

    def _watch(self):
        import threading
        self._tid = threading.get_native_id()
        while not self._done.wait(POLL_SECONDS):
            if self.watchdog.poll():
                self._fire()
                return

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
