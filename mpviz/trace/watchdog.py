"""The hang watchdog of ``python -m mpviz trace --hang-after S`` and ``record(hang_after=S)``.

Hangs are judged by what each thread waits on, not by silence. Every 0.1 s, each thread of each
watched process (osview.threads: /proc/PID/task/TID) either moved (it ran, or used CPU), waits
with a deadline (sleep(t), get(timeout=t): it moves when that ends), waits for ever (a lock with
no timeout, a pipe, a join: only another thread can end it), or reads a terminal (never a hang):

    DEADLOCK, one process:  every thread of it has waited `hang_after` s, with no time limit, on
                            a lock of its own memory: none can release it, whatever CPU others use
    DEADLOCK, everyone:     nothing moved and nothing was recorded for `hang_after` s, and every
                            thread waits for ever
    STALLED:                the same, but some wait with a deadline longer than `hang_after`
                            that has not run out yet (a timeout that ran out, and the same
                            wait began again, is a loop that polls: it waits for ever too)

A hang: SIGUSR1 to each recorded process (faulthandler, registered at start-up by
``autostart.register_stacks``, writes its stacks to DIR/.stacks/PID.txt); the caller ends the
processes (the launcher: the program's session; ``record()``: see ``Guard``); the stacks become
``watchdog.stuck`` events; ``verdict()`` says it in words (stuck.py: the kind of hang, where each
thread was and what it waits on; who waits for whom as far as the trace recorded it). A Ctrl-C
gets the same report first (``interrupt_report``), then the processes left are ended.

The scenarios' runner (scenarios/runner.py) judges with this one too: one watchdog.
A wait on something outside the program (a slow network read) looks like a hang: the verdict
shows the stacks; ``--hang-after 0`` turns it off; below MIN_HANG_AFTER it is refused.
"""
import contextlib
import math
import os
import re
import signal
import threading
import time

from .. import _proc
from . import analysis as st
from . import osview, recorder, session
from .names import SEMAPHORES, join_and
from .trace import Trace

POLL_SECONDS = 0.1
# A look reads every thread of every process (~40 of them, 2.5 ms of CPU, in a DataLoader's
# run: 0.5 s of the launcher's CPU in 20 s, beside the program). Against a long --hang-after
# they are spaced out, to 1/40 of it and at most LOOK_EVERY_MOST apart: a hang is still told
# within hang_after + 0.25 s, and nothing between two looks is missed (a thread's CPU time and
# run count only grow).
LOOK_EVERY_MOST = 0.25
MIN_HANG_AFTER = 0.5          # seconds: 5 looks; below it, a starting program reads as stuck
MOVE_CPU_NS = 20_000_000      # a thread that used this much CPU since it last moved: it works
STACKS = ".stacks"            # the folder in the trace directory where the stacks go
HANG_EXIT_STATUS = 124        # what `timeout` returns when it had to stop its command


# What a Pool's parent records while it replaces workers that die: no progress of the program's
_CHURN_KINDS = frozenset({"process.launch", "process.reaped", "thread.start", "thread.exit",
                          "shm.create", "shm.attach", "shm.detach", "shm.unlink"})


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


# Native threads of a library that wake many times a second whether or not anything comes
# (by their name, /proc/PID/task/TID/comm): torch.distributed's gloo polls its sockets every
# 10 ms and its run loop waits 10 ms at a time. Their CPU is no progress of the program's --
# what they deliver is (a collective's end, recorded; a thread that waits for them moves).
# Seen hiding a hang: a rank's main thread waited in ~ProcessGroupGloo for ever while these
# woke ~200 times a second, and the watchdog never fired (torch 2.13).
POLLERS = frozenset({"gloo_tcp_loop", "pt_gloo_runloop", "pt_tcpstore_uv"})
# A thread names itself as it begins to run: the watchdog reads a new thread's name again the
# first NAME_LOOKS times it has run since the last look, not only when it first sees it.
NAME_LOOKS = 5

# A process that can never move is judged when its children have done what they would: they may
# still be starting (spawn, on a busy machine: seconds) and about to put into a queue.Queue of
# their own -- the story of its wait. At most this many seconds (or hang_after) more, counted
# from when the last of them began to run the program's code (process.bootstrap): one still
# importing took more than the 5 s on a busy CI machine. At most CHILDREN_START_MOST s in all.
CHILDREN_GRACE = 5.0
CHILDREN_START_MOST = 60.0


class _Seen:
    """What the watchdog last saw of one thread. `again`: since it last moved, a wait of it
    with a deadline ran out and the same wait began again (a loop that polls: get(timeout=5)
    until something comes, as a DataLoader's main thread does). `poller`: one of POLLERS."""
    __slots__ = ("view", "moved", "since", "cpu_since_move", "again", "poller", "name_looks")

    def __init__(self, view, now):
        self.view, self.moved, self.since, self.cpu_since_move = view, now, now, 0
        self.again = False
        self.poller = view.tid != view.pid and \
            osview.thread_name(view.pid, view.tid) in POLLERS
        # (its name is read again the next few times it runs: _look)
        self.name_looks = NAME_LOOKS if view.tid != view.pid and not self.poller else 0


class ReadAside:
    """The launcher reads the logs while the program runs, in a thread of its own, so that what
    is left to read when the program ends is the last half second, not the whole run. (A
    10,000-batch DataLoader: 240,000 events, 0.45 s to read at the end, on top of the run.)
    At the same CPU priority as the program: at nice 19 it held the GIL, and so the watchdog,
    for seconds while a busy machine starved it -- a verdict judged 1.5 s late, on a program
    that had moved on (tests/hang_programs/parser_fed_by_main_later.py, under a test run).

    The trace is the watchdog's: the thread reads only while the launcher's main thread lets
    it -- while it waits for the program (``while_waiting``); the main thread holds the lock the
    rest of the time, so that nothing it reads changes under it. Whether what the thread read
    was progress is kept for the watchdog's next look (``take_progress``): read aside, it is
    not in what the watchdog reads itself."""

    EVERY_S = 0.5

    def __init__(self, trace):
        self.trace, self.progress, self.failed = trace, False, None
        self._held, self._stop = threading.Lock(), threading.Event()
        self._held.acquire()                       # (the main thread's, from now on)
        self._thread = threading.Thread(target=self._run, name="mpviz read-aside",
                                        daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.EVERY_S):
            if not self._held.acquire(timeout=0.2):
                continue
            try:
                if self.trace.refresh() and not self.progress:
                    self.progress = any(map(_progress, self.trace.last_read))
            except Exception as exc:               # (the end's own read reads it all again)
                self.failed = exc
                return
            finally:
                self._held.release()

    @contextlib.contextmanager
    def while_waiting(self):
        """The thread may read meanwhile (the main thread waits for the program)."""
        self._held.release()
        try:
            yield
        finally:
            self._held.acquire()

    def take_progress(self):
        progress, self.progress = self.progress, False
        return progress

    def stop(self):
        """No more reading aside (called by the main thread, which holds the lock)."""
        self._stop.set()
        self._thread.join()


class Watchdog:
    """Watches a trace directory and a set of processes; ``poll()`` says when they are stuck.

    `pids()`: the processes to watch, asked at every poll (the launcher: the program's session;
    ``record()``: this process and its descendants). `ignore()`: thread ids not to judge (the
    guard's own thread, in ``record()``).

    After ``poll()`` returned True: ``kind`` ("deadlock" or "stalled"), ``stuck_pids`` (the
    processes that can never move; empty when the whole program stalled), ``stalled_for``,
    ``for_good`` (recorded lock waits that can never end, found while other threads wait with
    a deadline: they make it a deadlock all the same).
    """

    def __init__(self, directory, hang_after, pids, ignore=None):
        self.directory, self.pids = directory, pids
        self.hang_after = check_hang_after(hang_after)
        self._ignore = ignore or (lambda: ())
        self.stacks_dir = os.path.join(directory, STACKS)
        self.crashes_said = set()       # pids whose crash note_ended_unwaited has recorded
        os.makedirs(self.stacks_dir, exist_ok=True)
        self.trace = Trace(directory)       # live: read when nothing moved, complete at the end
        self.aside = None                   # the launcher's ReadAside, reading as the program runs
        self.last_progress = time.monotonic()
        self.stalled_for = 0.0
        self.seen = {}                      # (pid, tid) -> _Seen
        self.threads_changed = {}           # pid -> when a thread of it last started or ended
        self.helpers = {}                   # pid -> "Python's fork server", or None: read once
        self.kind, self.stuck_pids, self.facts = None, [], None
        self._stuck_since = None            # when _never_moving first found a process, or
                                            # a child of it last was still starting
        self._stuck_found = None            # when _never_moving first found a process
        self._booted = (None, None, None)   # (events read, launched, booted): _starting
        self._joiners = (None, None)        # (stuck_pids, events read) -> _stuck_with_joiners
        self.for_good = []                  # analysis.Deadlocks that made a stall a deadlock
        self.handler_wait = None            # a Pool's result handler waiting in a callback
        self.broken, self._broken_looked = None, time.monotonic()   # a Pool's dead result
                                                                    # handler (thread.exit)
        self.churn, self._churn_looked = None, time.monotonic()     # Pool workers that die
                                                                    # as they start
        self.dist, self.judged_ns = False, None  # dist: judged by torch.distributed's events
        self._dist_looked = time.monotonic()
        self.look_every = min(LOOK_EVERY_MOST, max(POLL_SECONDS, self.hang_after / 40))
        self._looked = 0.0                      # when poll last looked

    def poll(self):
        """Look once: True when a process can never move, or nothing moved for `hang_after`.

        The logs are read only when no thread moved: a moving thread is progress already,
        and reading every event as it comes cost the launcher more than all else it does
        while a busy program runs (a 10,000-batch DataLoader: 290,000 events)."""
        now = time.monotonic()
        if now - self._looked < self.look_every - 0.01:    # (called every POLL_SECONDS)
            return False
        self._looked = now
        moved = self._look(now)
        aside = self.aside is not None and self.aside.take_progress()
        if moved or aside or self._recorded_progress():
            self.last_progress = now
        self.stalled_for = now - self.last_progress
        self.stuck_pids = self._never_moving(now)
        if not self.stuck_pids:
            self._stuck_since = self._stuck_found = None
        elif self._children_move(now):
            self.stuck_pids = []                 # (their next step may be the story: below)
            return False
        if self.stuck_pids:
            self.kind = "deadlock"
            self.stalled_for = max(now - self.seen[k].moved for k in self.seen
                                   if k[0] in self.stuck_pids)
        elif self.stalled_for > self.hang_after:
            # (a deadline that ran out and began again proved nothing comes: not a stall)
            servers = st.manager_servers(self.trace)     # (the Manager's own polling loop)
            waits = {s.view.wait for k, s in self.seen.items()
                     if not s.again and k[0] not in servers}
            self.kind = "stalled" if waits & {"sleep", "deadline"} else "deadlock"
        elif self._rendezvous_stalled(now):
            self.kind = "stalled"
        elif self._results_never_delivered(now) or self._workers_die_as_they_start(now):
            self.kind = "deadlock"
        else:
            return False
        from . import dist_verdict, stuck
        self._read_logs()                        # (the verdict names what the logs say)
        self.for_good = self._locked_for_good() if self.kind == "stalled" else []
        if self.for_good:                        # a deadline elsewhere cannot free them
            self.kind = "deadlock"
        self.facts = stuck.Facts(self, now)      # read /proc now: the processes die next
        self.judged_ns = time.monotonic_ns()
        judged = dist_verdict.judge(self.trace, self, until_ns=self.judged_ns)
        if judged is not None:                   # torch.distributed: its events come first
            self.kind, self.dist = judged.kind, True
        return True

    def _locked_for_good(self):
        """The recorded lock waits that can never end, whatever else waits with a deadline: a
        cycle of holders (a thread that waits for a lock it holds itself is one), or a holder
        that is a ghost (a lock copied held by a fork). ``analysis.Deadlock``s; [] if none."""
        if not self.trace.events:
            return []
        state = st.state_at(self.trace)
        found = [d for d in state.deadlocks if d.cycle or (d.pid, d.tid) in
                 {(pid, tid) for lk in state.locks for pid, tid, _ in lk.waiters
                  if any(o.ghost for o in lk.owners)}]
        stuck = {(d.pid, d.tid) for d in found}
        grew = True
        while grew:                 # ... and who waits for a lock only those threads hold
            grew = False
            for lk in state.locks:
                owners = {(o.pid, o.tid) for o in lk.owners if not o.ghost}
                if not owners or not owners <= stuck:
                    continue
                for pid, tid, _ in lk.waiters:
                    if (pid, tid) not in stuck:
                        holder = join_and([_thread_words(state, *o) for o in sorted(owners)])
                        found.append(st.Deadlock(pid, tid, (
                            f"{_thread_words(state, pid, tid)} waits for {lk.name or 'a lock'}, "
                            f"which {holder} holds")))
                        stuck.add((pid, tid))
                        grew = True
        return found

    def _results_never_delivered(self, now):
        """A Pool whose result handler thread an exception ended (a callback that raised:
        CPython gh-83371) delivers no result again; its worker handler thread may then spin
        (its outqueue is readable, and nobody reads it), so CPU is used and nothing is done.
        True when such a thread ended `hang_after` s ago or more, and its process's main
        thread has waited, with no time limit, as long: ``self.broken`` holds the
        ``thread.exit``. Looked at once per `hang_after` (it reads the logs)."""
        if now - self._broken_looked < max(self.hang_after, 1.0) or \
                not self._mains_waiting(now):      # (/proc first: the logs cost more)
            return False
        self._broken_looked = now
        self._read_logs()
        now_ns = time.monotonic_ns()
        pool_threads = {(e.pid, e.tid) for e in self.trace.of_kind("thread.start")
                        if str(e.args.get("name")).endswith(("(_handle_workers)",
                                                             "(_handle_tasks)"))}
        for e in self.trace.of_kind("thread.exit"):
            main = self.seen.get((e.pid, e.pid))
            if not (e.args.get("error") and "_handle_results" in str(e.args.get("name"))
                    and main is not None and main.view.wait == "forever"
                    and (now_ns - e.ts_ns) / 1e9 >= self.hang_after):
                continue
            # nothing moved but that Pool's own threads; its main thread waits in no recorded
            # wait but the Pool's (a get() of a queue another process may still fill, no)
            if any(now - seen.moved < self.hang_after for key, seen in self.seen.items()
                   if key not in pool_threads or key[0] != e.pid):
                continue
            if any(b.pid == e.pid and b.tid == e.pid and b.on != "pool.result"
                   for b in st.state_at(self.trace).blocked):
                continue
            self.broken = e
            self.stalled_for = now - main.moved
            return True
        return self._handler_waits_for_itself(now, now_ns, pool_threads)

    def _handler_waits_for_itself(self, now, now_ns, pool_threads):
        """The same Pool, its result handler thread alive but inside a callback that waits --
        for a result of that Pool (pool.apply() in a callback), or anything else: no result is
        delivered while it waits, and a result of the Pool is what it waits for, so it waits
        for itself. ``self.handler_wait``: (that wait's ``Blocked``, the thread's name)."""
        handlers = {(e.pid, e.tid): e.args.get("name") for e in self.trace.of_kind("thread.start")
                    if str(e.args.get("name")).endswith("(_handle_results)")}
        if not handlers:
            return False
        for b in st.state_at(self.trace).blocked:
            main = self.seen.get((b.pid, b.pid))
            if (b.pid, b.tid) not in handlers or main is None or \
                    main.view.wait != "forever" or (now_ns - b.since_ns) / 1e9 < self.hang_after:
                continue
            if any(now - seen.moved < self.hang_after for key, seen in self.seen.items()
                   if key not in pool_threads or key[0] != b.pid):
                continue
            self.handler_wait = (b, handlers[b.pid, b.tid])
            self.stalled_for = now - main.moved
            return True
        return False

    def _mains_waiting(self, now):
        """The processes whose main thread has waited, with no time limit, for `hang_after`
        s (what /proc says: no log read)."""
        return {pid for (pid, tid), seen in self.seen.items() if pid == tid and
                seen.view.wait == "forever" and now - seen.moved >= self.hang_after}

    def _workers_die_as_they_start(self, now):
        """A Pool whose workers all end before they run a task -- an initializer that raises
        (CPython gh-87472) -- starts new ones for ever: processes come and go, which looks like
        progress, and map() never returns. True when, for `hang_after` s, the only things that
        happened are Pool workers that started and ended (exit status not 0) without running a
        task, at least two, while a thread of their parent waits, with no time limit, for a
        Pool's result: ``self.churn`` = (those workers' ProcessInfos, the waiting (pid, tid)).
        Looked at once per `hang_after` (it reads the logs)."""
        if now - self._churn_looked < max(self.hang_after, 1.0) or \
                not self._mains_waiting(now):      # (/proc first: the logs cost more)
            return False
        self._churn_looked = now
        self._read_logs()
        since = time.monotonic_ns() - int(self.hang_after * 1e9)
        procs = self.trace.processes()
        died = [p for p in procs if "PoolWorker" in str(p.name) and p.exit_ns is not None
                and p.exit_ns >= since and (p.exitcode or p.signal)]
        if len(died) < 2:
            return False
        ran = {e.pid for e in self.trace.of_kind("pool.task") if e.args.get("phase") == "start"}
        if any(p.pid in ran for p in died):
            return False
        parents = {p.ppid for p in died}
        for e in reversed(self.trace.events):  # the parent did something else meanwhile?
            if e.ts_ns < since:
                break
            if e.pid in parents and e.kind not in _CHURN_KINDS:
                return False
        state = st.state_at(self.trace)
        waiting = [(b.pid, b.tid) for b in state.blocked
                   if b.pid in parents and b.on == "pool.result" and b.since_ns <= since]
        if not waiting or any(now - self.seen[w].moved < self.hang_after
                              for w in waiting if w in self.seen):
            return False
        self.churn = (died, waiting[0])
        self.stalled_for = self.hang_after
        return True

    def _rendezvous_stalled(self, now):
        """torch.distributed's store polls while init_process_group waits for ranks that do
        not come: its threads move, and nothing else does. Once per `hang_after` the logs are
        read to see it (dist_verdict.rendezvous_stalled)."""
        if now - self._dist_looked < max(self.hang_after, 1.0):
            return False
        self._dist_looked = now
        if not os.path.exists(os.path.join(self.directory, recorder.RENDEZVOUS)):
            return False                  # (no process began one: nothing to read the logs for)
        self._read_logs()
        from . import dist_verdict
        moving = {pid for (pid, _), seen in self.seen.items()
                  if now - seen.moved < self.hang_after}
        waited = dist_verdict.rendezvous_stalled(self.trace, self.hang_after, moving)
        if waited:
            self.stalled_for = waited
        return bool(waited)

    def _read_logs(self):
        """The events written since the last read; [] when a log is being created right now
        (the next read has it)."""
        try:
            self.trace.refresh()
        except Exception:
            return []
        return self.trace.last_read

    def _recorded_progress(self):
        """Did the program record progress since the logs were last read? (What they read
        after threads moved holds events of that time too: counted now, they put a verdict off
        by one look at most, never bring it forward.)"""
        return any(_progress(e) for e in self._read_logs())

    def _look(self, now):
        """Read every thread; update what was seen; True if any moved (or came, or went)."""
        ignore = set(self._ignore())
        views, before = {}, {}
        for (pid, tid), s in self.seen.items():
            before.setdefault(pid, {})[tid] = s.view
        for pid in self.pids():
            if pid not in self.helpers:       # (while it runs: a report may come after the kill)
                self.helpers[pid] = helper_name(pid)
            for view in osview.threads(pid, before.get(pid)):
                if view.tid not in ignore:
                    views[(pid, view.tid)] = view
        moved = set(views) != set(self.seen)          # a thread (or process) started or ended
        if moved:
            now_tids = {}
            for pid, tid in views:
                now_tids.setdefault(pid, set()).add(tid)
            for pid, tids in now_tids.items():
                if tids != set(before.get(pid, ())):
                    self.threads_changed[pid] = now
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
            if ran and old.name_looks:
                # A thread names itself once it runs (gloo's do, first thing): seen before
                # that, it had its process's name -- and its polling was taken for the
                # program's loop ("DEADLOCK, unless a loop gives up by itself", a CI run)
                old.poller = osview.thread_name(*key) in POLLERS
                old.name_looks = 0 if old.poller else old.name_looks - 1
            if old.poller:                  # (its wake-ups are no progress: see POLLERS)
                old.again = True
            elif view.wait == "terminal" or old.cpu_since_move >= MOVE_CPU_NS or (
                    ran and (view.key != prev.key or prev.wait in ("sleep", "running"))):
                old.moved, old.since, old.cpu_since_move, old.again = now, now, 0, False
                moved = True
            elif ran and prev.wait == "deadline":
                old.again = True
        self.seen = seen
        return moved

    def _never_moving(self, now):
        """Processes whose every thread waits for ever on a lock of its own (a private futex),
        for `hang_after` s: none of them can release another. [] when there is none.

        Counted from a thread's last move, and from the last time a thread of that process
        started or ended: a thread that ends releases what it held (a join's lock), and the
        waiter it woke may not have run yet on a busy machine. Judged at once, a main thread
        joining a thread that had just ended was a DEADLOCK."""
        by_pid = {}
        for (pid, _tid), s in self.seen.items():
            by_pid.setdefault(pid, []).append(s)
        return [pid for pid, threads in by_pid.items()
                if all(s.view.private and
                       now - max(s.moved, self.threads_changed.get(pid, 0)) > self.hang_after
                       for s in threads)]

    def _children_move(self, now):
        """Do descendants of the processes that can never move still move -- and have they for
        less than CHILDREN_GRACE (or hang_after) s since those were found? Then the verdict
        waits for them: a child under spawn still starting when its parent's get() had waited
        1.5 s (a CI run) was killed before its put() into a queue.Queue of its own, and the
        verdict said "no thread has put into it yet ... Fix: put into it before waiting". A
        child in a sleep counts as moving: a sleep ends. The grace is counted again while a child
        is still starting (it moves, and has not begun to run the program's code): one still
        importing after the 5 s on a busy CI machine, then downloading for 2.5 s, was killed
        with the same false words."""
        if self._stuck_since is None:
            self._stuck_since = self._stuck_found = now
        if now - self._stuck_since > max(CHILDREN_GRACE, self.hang_after):
            return False
        parents = {pid: getattr(_proc.stat(pid), "ppid", None)
                   for pid in {p for p, _ in self.seen}}       # (one stat a process)
        stuck, theirs = set(self.stuck_pids), set()
        for pid in parents:
            up, hops = parents.get(pid), 0
            while up is not None and up not in stuck and hops < 16:
                up, hops = parents.get(up), hops + 1
            if up in stuck:
                theirs.add(pid)
        # (moving: it ran since the last looks, or it waits with a deadline -- a sleep ends)
        moving = {pid for (pid, _), s in self.seen.items() if pid in theirs and (
            now - s.moved < 2 * self.look_every + POLL_SECONDS or
            s.view.wait in ("sleep", "deadline"))}
        if moving and moving & self._starting() and now - self._stuck_found < CHILDREN_START_MOST:
            self._stuck_since = now
        return bool(moving)

    def _starting(self):
        """Pids of the processes started by Process.start() (recorded: ``process.launch``)
        that have not begun to run the program's code yet (no ``process.bootstrap``): still
        importing, under spawn. (The logs are read here: while the children import, every
        look sees a thread move, and poll() does not read them.)"""
        self._read_logs()
        key = len(self.trace.events)
        if self._booted[0] != key:
            launched = {e.args.get("child") for e in self.trace.of_kind("process.launch")
                        if e.args.get("start_method") in ("fork", "spawn", "forkserver")}
            booted = {e.pid for e in self.trace.of_kind("process.bootstrap")}
            self._booted = (key, launched, booted)
        return self._booted[1] - self._booted[2]

    def reason(self, pid):
        """What the verdict says of process `pid`, for its ``watchdog.stuck`` event (the
        pictures frame "deadlock" as STUCK FOR GOOD): "deadlock" (it can never move),
        "stalled" (a deadline longer than --hang-after holds it up), or "stopped" (it could
        still move, but was ended with the processes that cannot; a Manager's server process,
        which waits for the program's calls)."""
        if self.stuck_pids:
            return "deadlock" if pid in self._stuck_with_joiners() else "stopped"
        if pid in st.manager_servers(self.trace):
            return "stopped"        # a Manager's server serves the others: they are the hang
        return self.kind or "deadlock"

    def _stuck_with_joiners(self):
        """`stuck_pids` and, with them, each process with a thread inside a join of one of
        them with no time limit (recorded: ``wait.begin`` on "process", not ended), and so on
        up: a parent in ``p.join()`` of a child that can never move never moves either --
        except this process (``record()``'s, a notebook's kernel): the kill this watchdog sets
        off ends its join, and its other threads go on."""
        key = (tuple(self.stuck_pids), len(self.trace.events))
        if self._joiners[0] == key:
            return self._joiners[1]
        stuck, me = set(self.stuck_pids), os.getpid()
        open_joins = st.open_joins(self.trace)
        while True:
            more = {pid for (pid, _tid), child in open_joins.items()
                    if child in stuck and pid not in stuck and pid != me}
            if not more:
                self._joiners = (key, stuck)
                return stuck
            stuck |= more

    def capture_stacks(self, extra=None):
        """``{pid: {"name", "stacks"}}`` of every recorded process still running, asked with
        SIGUSR1 (the runner's way: faulthandler answers even while a thread is blocked).
        `extra`: ``{pid: text}`` stacks already known (this process's own, in ``record()``)."""
        self.note_ended_unwaited()
        names = labels(self.trace)
        pids = [pid for pid in self.pids() if pid in names and pid not in (extra or {})]
        out = session.capture_stacks(pids, names, self.stacks_dir)
        for pid, text in (extra or {}).items():
            out[pid] = {"name": names.get(pid), "stacks": text}
        return out

    def note_ended_unwaited(self):
        """Record how the program's processes that ended unrecorded ended -- a crash in native
        code (SIGSEGV), a kill, os._exit -- where their parent has not waited for them yet: a
        zombie keeps its exit status until then (osview.ended_unwaited). ``process.reaped``
        (by "zombie"), written before the kill, so that a wait for what such a process was to
        send names how it ended."""
        from .autostart import crash_report
        ended = {}
        for p in self.trace.processes():
            if p.ppid and p.signal in st.CRASHES and p.pid not in self.crashes_said:
                crash = crash_report(self.stacks_dir, p.pid)    # (a join saw the signal:
                line = st.user_line(crash[1]) if crash else ""  # the line is the report's)
                if line.startswith(" (at your line "):
                    ended[p.pid] = (p.exitcode, p.signal, "crash report",
                                    line[len(" (at your line "):-1])
            elif p.exit_ns is None and p.exitcode is None and p.signal is None and p.ppid:
                status = osview.ended_unwaited(p.pid, p.ppid)
                # the report faulthandler wrote as it crashed, if it did (autostart's
                # crash_report): its line -- and how it ended, where the process that reaped
                # it is not recorded (the fork server)
                crash = crash_report(self.stacks_dir, p.pid)
                line = st.user_line(crash[1]) if crash else ""   # " (at your line x.py:12 ...)"
                at = line[len(" (at your line "):-1] if line.startswith(" (at your line ") \
                    else None
                if status is not None:
                    ended[p.pid] = status + ("zombie", at)
                elif crash is not None:
                    number = getattr(signal.Signals, crash[0], None)
                    ended[p.pid] = (-number if number else None, crash[0], "crash report", at)
        if not ended:
            return
        try:
            log = recorder.SideLog(self.directory, "watchdog")
        except OSError:
            return
        self.crashes_said.update(ended)
        try:
            for pid, (code, sig, by, at) in ended.items():
                log.emit("process.reaped", child=pid, exitcode=code, signal=sig, by=by,
                         **({"at": at} if at else {}))
        finally:
            log.close()
        self.trace.refresh()

    def record_verdict(self, stacks, killed, kill_ns=None):
        """Write the stacks as ``watchdog.stuck`` events and the kill as ``watchdog.kill``
        (a log of the watchdog's own, merged into the trace like any process's). `kill_ns`:
        when the killing began (``time.monotonic_ns()``): what the kill set off -- a worker's
        get() that ends in EOFError as its parent dies -- comes after it, and the waits are
        judged just before it (``analysis.stuck_moment``)."""
        if self.dist:         # the stacks settle what the events could not: the kind again
            from . import dist_verdict      # (a DDP rank waiting in backward(): a deadlock)
            judged = dist_verdict.judge(self.trace, self, stacks, self.judged_ns)
            self.kind = judged.kind if judged is not None else self.kind
        recorded = {p.pid for p in self.trace.processes()}
        record_stuck(self.directory, stacks, self.reason, self.stalled_for, killed, "stuck",
                     kill_ns, reaped=[pid for pid in killed if pid in recorded])

    def look_now(self):
        """Look at every thread once more, for a Ctrl-C's report (``stuck.threads_in_words``
        with ``chains=False`` says it: a busy program's threads work, they do not wait).
        Before the stacks are asked for: a thread that wrote its stack has run."""
        from . import stuck
        now = time.monotonic()
        if self._look(now):
            self.last_progress = now          # (a move this look saw is not lost to poll())
        self.facts = stuck.Facts(self, now)

    def verdict(self, stacks, killed):
        """The hang in words: its kind, where each thread was and what it waits on, who waits
        for whom."""
        from . import dist_verdict, stuck
        judged = dist_verdict.judge(self.trace, self, stacks, self.judged_ns) if self.dist \
            else None
        if judged is not None:
            lines = judged.headline(len(killed)) + judged.lines
        else:
            lines = stuck.headline(self, len(killed))
        lines += stuck.threads_in_words(self, stacks)
        lines += ["Where each process was (Python stacks captured before they were killed, "
                  "innermost call first; ... leads to the program's own line):",
                  stack_summary(stacks, trace=self.trace)]
        lines += waits_in_words(self.trace)
        return "\n".join(lines)


def record_stuck(directory, stacks, reason, seconds, killed, why, kill_ns=None, reaped=()):
    """The one writer of a watcher's verdict (this watchdog's, and the scenarios' runner's):
    ``watchdog.stuck`` for each process in `stacks` (``reason(pid)``: "deadlock", "stuck" ...),
    ``watchdog.kill`` (`why`: what ended the run), and ``process.reaped`` for each of `reaped`
    (for the pictures: how they ended, not "still running"). In a log of the watchdog's own
    (``recorder.SideLog``), merged into the trace like any process's."""
    try:
        log = recorder.SideLog(directory, "watchdog")
    except OSError:
        return
    try:
        for pid, info in stacks.items():
            log.emit("watchdog.stuck", pid=pid, name=info["name"],
                     stacks=without_hooks(info["stacks"]), reason=reason(pid),
                     seconds=round(seconds, 2))
        log.emit("watchdog.kill", pids=list(killed), reason=why,
                 **({"at_ns": kill_ns} if kill_ns else {}))
        for pid in reaped:
            log.emit("process.reaped", child=pid, exitcode=-signal.SIGKILL, signal="SIGKILL",
                     by="watchdog")
    finally:
        log.close()


def without_hooks(stacks):
    """faulthandler's text without the frames of mpviz's recording hooks (mpviz/trace/: a
    recorded get() runs inside waits.py and messages.py), as the verdict prints it: the stacks
    kept in the trace (trace.json, ``watchdog.stuck``) show the program's calls, not ours."""
    from .stuck import _HOOKS
    if not isinstance(stacks, str):
        return stacks
    keep = []
    for line in stacks.splitlines(keepends=True):
        if line.startswith('  File "'):
            path = line[8:].split('"', 1)[0]
            if os.path.realpath(path).startswith(_HOOKS):
                continue
        keep.append(line)
    return "".join(keep)


def interrupt_report(trace, stacks, at=None, who="mpviz trace", threads=()):
    """Ctrl-C is a diagnosis: the hang verdict's report, at the moment of an interrupt -- each
    process's stack down to the program's own line, what each waits for, who must act. `at`:
    the instant to judge the waits at (default: the trace's end). `threads`: lines saying
    where each thread is by /proc (``Watchdog.look_now``): working, or waiting on what."""
    where = stack_summary(stacks, trace=trace) if stacks else (
        "  (no process left to ask: the same Ctrl-C reached them all, and each had already "
        "raised KeyboardInterrupt and ended -- a Ctrl-C to this process alone, `kill -INT PID`, "
        "shows where they were)")
    waits = waits_in_words(trace, at)
    return "\n".join([f"{who}: INTERRUPTED (Ctrl-C): where each process was when it came "
                      f"(Python stacks, innermost call first; ... leads to the program's own "
                      f"line):", where] + list(threads) + waits)


def interrupt_stacks(stacks, stacks_dir):
    """`stacks` (``capture_stacks``'s), with each process's stacks at the SIGINT itself where it
    wrote them (``autostart.register_stacks``: PID.int.txt) -- a process the same Ctrl-C
    reached unwinds at once, and what SIGUSR1 finds afterwards is its exception handling, or
    nothing (it has exited). Processes found only there are added."""
    from .autostart import INTERRUPT_SUFFIX
    out = dict(stacks)
    try:
        names = os.listdir(stacks_dir)
    except OSError:
        return out
    for name in names:
        if not name.endswith(INTERRUPT_SUFFIX) or not name[:-len(INTERRUPT_SUFFIX)].isdigit():
            continue
        try:
            with open(os.path.join(stacks_dir, name), errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        last = _last_dump(text)
        if "File " not in last:
            continue
        pid = int(name[:-len(INTERRUPT_SUFFIX)])
        out[pid] = {"name": (out.get(pid) or {}).get("name"), "stacks": last}
    return out


def _last_dump(text):
    """The last of the faulthandler dumps appended to one file: a dump lists each thread once
    ("Thread 0x..." / "Current thread 0x..."), so a thread seen again starts the next one."""
    dumps, seen = [[]], set()
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            tid = line.split()[2 if line.startswith("Current") else 1]
            if tid in seen:
                dumps.append([])
                seen = set()
            seen.add(tid)
        dumps[-1].append(line)
    return "\n".join(dumps[-1]).strip()


def stack_summary(stacks, frames=3, trace=None):
    """Each process's threads, one line each: the innermost `frames` calls and, if they are
    all in the stdlib or mpviz, the innermost call in the program's own code (the line to
    read first). A thread the `trace` saw start is called by its name. The whole stacks are
    in the trace (``watchdog.stuck`` events)."""
    if not stacks:
        return "  (no stacks: the processes had already exited)"
    lines = []
    for pid, info in stacks.items():
        lines.append(f"  pid {pid} ({info['name'] or '?'}):")
        named = {} if trace is None else {    # faulthandler's "Thread 0x..." is its ident
            e.args.get("ident"): e.args.get("name") for e in trace.of_kind("thread.start")
            if e.pid == pid and e.args.get("ident") is not None}
        threads = parse_stacks(info["stacks"], named)
        if not threads:
            lines.append(f"    {info['stacks'].strip()[:200]}")
        for thread, calls in threads:
            shown = [call for call, _ in calls[:frames]]
            own = None if any(mine for _, mine in calls[:frames]) else \
                next((call for call, mine in calls[frames:] if mine), None)
            if own:
                shown.append(f"... {own}")
            elif len(calls) > frames:
                shown.append("...")
            lines.append(f"    {thread}: {' <- '.join(shown) or '(no Python frames)'}")
    return "\n".join(lines)


def parse_stacks(text, named=None):
    """faulthandler's text as [(thread label, [("fn (file.py:line)", in the program?)])]
    (in the program: stuck's test, which the verdict's own lines use). `named`: {ident: a
    thread's name}, for "thread `Thread-2 (consumer)`" rather than "thread"."""
    from .stuck import _HOOKS, _mine, garbled_frame
    threads, forked = [], False       # forked: below a fork, the parent's frames (own_frames)
    garbled = set()                   # threads whose block faulthandler read while it ran
    names = []                        # each block's thread name, where `named` knows it
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
            try:
                names.append((named or {}).get(int(line.split("0x", 1)[1].split()[0], 16)))
            except ValueError:
                names.append(None)
            forked = False
        elif line.startswith("File ") and threads and not forked:
            try:
                path, rest = line[6:].split('", line ', 1)
                lineno, fn = rest.split(" in ", 1)
            except ValueError:
                threads[-1].append((line, False))
                continue
            if fn == "_launch" and path.endswith("popen_fork.py"):
                forked = True
                continue
            if garbled_frame(path, fn, int(lineno) if lineno.isdigit() else None):
                threads[-1].append(("(not readable from here on: the thread ran on while its "
                                    "stack was taken)", False))
                garbled.add(len(threads) - 1)
                forked = True              # (nothing more of this block)
                continue
            if os.path.realpath(path).startswith(_HOOKS):
                continue                   # a recording hook's frame (waits.py, locks.py ...)
            threads[-1].append((f"{fn} ({os.path.basename(path)}:{lineno})", _mine(path)))
    # faulthandler does not say which thread is the main one: the others began in threading's
    # Thread._bootstrap
    return [(f"thread `{names[i]}`" if names[i] and calls and
             calls[-1][0].startswith("_bootstrap (threading.py") else
             "thread" if calls and calls[-1][0].startswith("_bootstrap (threading.py") else
             "a thread" if i in garbled else "main thread", calls)
            for i, calls in enumerate(threads)]


def waits_in_words(trace, at=None):
    """Who waits for whom when the run got stuck (or at instant `at`), as far as the trace
    recorded it."""
    at = st.stuck_moment(trace) if at is None else at
    state = st.state_at(trace, at)
    lines = []
    for lk in state.locks:
        owners = ", ".join(f"{state.labels.get(o.pid, o.pid)}'s {o.thread}"
                           + (f" ({o.ghost})" if o.ghost else "") for o in lk.owners)
        for pid, tid, since in lk.waiters:
            who = f"{state.labels.get(pid, pid)}'s {state.thread_names.get((pid, tid), tid)}"
            lines.append(f"  {who} waits for {lk.name or lk.type or 'a lock'}"
                         + (f", held by {owners}" if owners else _unheld(lk)))
    idle = st.idle_pool_workers(trace, at)
    for b in state.blocked:       # joins, q.join, a full pipe, Events ... (waits.py)
        if b.pid in idle:
            continue
        lines.append(f"  {_thread_words(state, b.pid, b.tid)} waits: {b.what} -- "
                     f"{_who_must_act(state, b, trace)}")
    told = {b.target for b in state.blocked if b.on == "pool.result"}
    for task in st.every_lost_pool_task(trace, state.t_ns):    # (no get() of its own waits)
        if task.job not in told:
            lines.append(f"  {task.words()}, and so does whatever waits for all its jobs "
                         f"(pool.join() after close()){_lost_why([task])}")
    executors = st.executor_workers(trace)
    for pid in sorted(idle):
        pool = "ProcessPoolExecutor" if pid in executors else "Pool"
        lines.append(f"  {state.labels.get(pid, pid)} is idle, not stuck: it waits for its next "
                     f"task from the {pool}, and goes on when the program gives the {pool} work")
    for d in state.deadlocks:         # (a cycle is one Deadlock per thread in it: said once)
        said = f"  STUCK FOR GOOD: {d.reason}"
        if (d.cycle or "watchdog" not in d.reason) and said not in lines and \
                not _told_already(d, lines):
            lines.append(said)
    lines += _hang_at_exit(state, trace)
    lines += _ended_by_errors(state, trace)
    if not lines:
        return ["Who waits for whom: the trace recorded no wait that was still open (read the "
                "stacks above: the innermost call is where each thread was)."]
    return ["Who waits for whom (recorded waits still open when it stopped):"] + lines


def _told_already(deadlock, lines):
    """A result that will never come, whose why a who-waits line said already ("nobody can:
    Pool job 0 ... will never finish: the Pool was terminated ..."): the STUCK FOR GOOD line
    would say it a third time (the thread's line above says it too)."""
    core = deadlock.reason.split(" (at your line")[0]
    if deadlock.cycle or "which will never come: " not in core:
        return False
    why = core.split("which will never come: ", 1)[1]
    return any(why in line for line in lines)


def _unheld(lock):
    """A lock waited for that no recorded thread holds. A Semaphore is not held as a Lock is:
    it waits because its count is 0, and goes on when any thread calls release() -- which one
    made with 0 needs first. A Lock: a holder the trace did not see (one that took it before
    recording began, or outside the program's recorded processes)."""
    if lock.type in SEMAPHORES:
        return (": its count is 0, and no thread the trace recorded holds an acquire of it "
                "to release -- it goes on only when some thread calls its release() (one made "
                "with Semaphore(0) needs that first)")
    return ", held by no thread the trace recorded (taken before recording began?)"


RESULT_HANDLER_DIED = (
    ": that thread is the Pool's result handler -- no result of this Pool is delivered any "
    "more, so whatever waits for one, and pool.join(), waits for ever")
# ... why, by the library function that ran the program's code there
RESULT_HANDLER_WHY = {
    "_set": " (it runs each callback= and error_callback=, and yours raised. Fix: let a "
            "callback neither raise nor wait for the Pool)",
    "recv": " (it raised as it unpickled a result: an exception whose class cannot be "
            "rebuilt from its args, CPython gh-103061. Fix: pass the same arguments to "
            "super().__init__ as the exception's own __init__ takes)"}
RESULT_HANDLER_WHY["get"] = RESULT_HANDLER_WHY["recv"]     # (a queue's get, on other Pythons)


def _ended_by_errors(state, trace):
    """Threads and processes an exception ended before the hang, where nothing above said so
    already: a dead thread waits for nothing, so it is in no wait line -- but what it would
    have done (a Pool's result handler delivers results) is what the others wait for."""
    said = {who for b in state.blocked if b.on == "queue.get" and not b.waits_for
            for who, _ in st.gone_without_putting(trace, b.target, state.t_ns, b.pid)}
    # (_who_must_act's: a get that names who must put says nothing of those who ended)
    said |= {who for b in state.blocked if b.on == "queue.join"
             for who, _ in _ended_getters(state, trace, b)}
    said |= {who for b in state.blocked if b.on in ("event", "condition")   # (_signal_short's)
             for who, _ in st.gone_without_signalling(trace, b.on, b.target, state.t_ns, b.pid)}
    out, ended = [], {}               # how -> the processes that ended so (a Pool's many)
    for pid, tid, name, error, at, via, how in st.errors_before(trace, state.t_ns):
        label = state.labels.get(pid, pid)
        where = f", raised at {at}" if at else ""
        if tid is not None:
            why = RESULT_HANDLER_DIED + RESULT_HANDLER_WHY.get(via, "") \
                if "_handle_results" in str(name) else ""
            out.append(f"  ENDED BY AN ERROR: {label}'s thread `{name}` ended with "
                       f"{error}{where}{why}")
        elif label not in said:
            ended.setdefault(how, []).append(str(label))
    for how, labels in ended.items():
        who = join_and(labels) if len(labels) <= 3 else \
            f"{len(labels)} processes ({', '.join(labels[:3])} ... {labels[-1]})"
        out.append(f"  ENDED BY AN ERROR: {who} ended ({how}) before the hang")
    return out


def _hang_at_exit(state, trace):
    """The queue-join deadlock at interpreter exit, told as one story (the queue-join-deadlock
    scenario's words): a process that put more on a queue than its pipe holds ends its work;
    at exit it joins its queue's feeder thread, which waits to write into the full pipe; the
    process that would read the queue waits in ``join`` for it first."""
    joins = {(b.pid, b.target): b for b in state.blocked if b.on == "thread"}
    out = []
    for write in (b for b in state.blocked if b.on == "pipe.write"):
        exiting = joins.get((write.pid, write.tid))
        if exiting is None:
            continue
        child, queue = state.labels.get(write.pid, write.pid), \
            state.channel_names.get(write.target, write.target)
        joiners = [b for b in state.blocked if b.on == "process" and b.target == write.pid]
        never_got = sum(1 for f in trace.flows() if f.channel == write.target and f.get is None)
        at_exit = exiting.what.endswith("at exit")
        feeder = state.thread_names.get((write.pid, write.tid), "thread")
        out.append(f"  {'HANG AT EXIT' if at_exit else 'HANG'}: {child} has done its work but "
                   f"cannot {'exit' if at_exit else 'go on'}: "
                   f"{'at exit' if at_exit else 'in q.join_thread()'} it waits for its feeder "
                   f"thread ({feeder}), which waits to write into the full pipe of {queue} "
                   f"({never_got:,} message{'s' * (never_got != 1)} put there and never got; a "
                   f"pipe holds {st.PIPE_BYTES // 1024} KiB).")
        for b in joiners:
            if b.what.endswith("at exit"):
                how = (f" at exit (multiprocessing joins the children a program did not join), "
                       f"and will read {queue} no more")
            else:
                where = _user_line(trace, b.pid)
                how = (f" {where}" if where else "") + (
                    f"; nothing reads {queue} meanwhile (a get() before the join would empty "
                    f"its pipe)")
            out.append(f"  {_thread_words(state, b.pid, b.tid)} waits in `join` for {child}"
                       f"{how}: each waits for the other, for ever.")
        out.append(f"  Fix: get everything a process put on a queue before joining it (the "
                   f"stdlib's \"Joining processes that use queues\"), or call "
                   f"q.cancel_join_thread() in {child} if losing what it put is fine.")
    return out


def _user_line(trace, pid):
    """" (at your line ...)" from the watchdog's stacks of `pid`, or ""."""
    for e in trace.of_kind("watchdog.stuck"):
        if e.args.get("pid") == pid:
            return st.user_line(e.args.get("stacks")).strip()
    return ""


def _thread_words(state, pid, tid):
    return f"{state.labels.get(pid, pid)}'s {state.thread_names.get((pid, tid), f'thread {tid}')}"


LOST_WHY = (" (a Pool replaces a worker that ends, not the task it was running: bpo-22393). "
            "Fix: raise an exception in the task instead of sys.exit() or os._exit() (the Pool "
            "sends an exception back to the caller), or use "
            "concurrent.futures.ProcessPoolExecutor, which raises BrokenProcessPool when a "
            "worker dies (os._exit, a crash) and raises a task's sys.exit() in the caller as "
            "SystemExit (uncaught, it ends the program with that status and no traceback)")
# ... and for a worker a signal ended: no exit the task could have raised instead
LOST_KILLED_WHY = (" (a Pool replaces a worker that ends, not the task it was running: "
                   "bpo-22393). Fix: find what killed it (a SIGKILL the program did not send "
                   "is most often the kernel's out-of-memory killer: the kernel log, dmesg, "
                   "names it; a SIGSEGV is a crash in native code), and use "
                   "concurrent.futures.ProcessPoolExecutor, which raises BrokenProcessPool in "
                   "the caller when a worker dies instead of waiting for ever")


def _lost_why(tasks):
    """Why those tasks' results never come, and the fix: by how their workers ended."""
    return LOST_KILLED_WHY if all(task.signal for task in tasks) else LOST_WHY


def _ended_badly(state, trace, threads):
    """Did an exception, a signal or a non-zero exit status end one of `threads` ((pid, tid)s)
    or its process before the hang? (Not known -- no trace -- counts as yes.)"""
    if trace is None:
        return True
    raised = {(pid, tid) for pid, tid, *_ in st.errors_before(trace, state.t_ns)}
    alive = {p.pid for p in state.processes}
    return any((pid, tid) in raised or (pid, None) in raised or
               (pid not in alive and st.how_it_ended(trace, pid) != "exit 0")
               for pid, tid in threads)


def _putters_ended(state, blocked, who):
    """A get on a queue whose every thread seen putting has ended, none badly (one that raised,
    was killed or exited non-zero is the story: it "must put -- but it has ended", and how it
    ended is said). They put already and ended well, so "they must put" is no fact: a queue is
    often a global (a queue.Queue in threads; a multiprocessing.Queue a forked child inherits),
    and who reaches it so is unseen until it puts -- the one that would put may be waiting
    elsewhere, or was never started (tests/hang_programs/results_via_global.py,
    worker_never_started.py)."""
    name = blocked.what.split(":")[0].split(" on ", 1)[-1]
    one = len(blocked.waits_for) == 1
    other = ("A thread that reaches {} another way (a global, a closure, an attribute)"
             if blocked.on == "thread_queue.get" else
             "A process or thread that reaches {} another way (a global, which a forked child "
             "inherits; a closure; an attribute)").format(name)
    return (f"{who} put into it and {'has' if one else 'have'} ended: no thread seen putting "
            f"into it can put again. {other} is seen only once it puts: the stacks above say "
            f"where each thread is")


def _pool_job_words(state, blocked, trace):
    """Why a Pool job's result will not come, where the trace knows: its Pool was terminated,
    a worker ended while running its task, or no worker has started it; None otherwise."""
    dropped = st.terminated_job(trace, blocked.target, state.t_ns, blocked.pid)
    if dropped:
        return f"nobody can: {dropped[0]} will never finish: {dropped[1]}"
    lost = st.lost_pool_tasks(trace, blocked.target, state.t_ns)
    if lost:
        return "; ".join(task.words() for task in lost) + _lost_why(lost)
    if not blocked.waits_for:
        queued = st.unstarted_job(trace, blocked.target, state.t_ns)
        if queued is not None:
            return _queued_job_words(state, blocked, *queued)
    return None


def _who_must_act(state, blocked, trace=None):
    """The end of a wait's line: who must act, as the wait-for graph's arrows say it."""
    if blocked.on == "pool.result" and trace is not None:
        said = _pool_job_words(state, blocked, trace)
        if said:
            return said
    if blocked.on == "queue.join" and not blocked.waits_for and trace is not None:
        dropped = _dropped_words(state, blocked)
        if dropped:
            return "nobody has got from it -- " + dropped
    if blocked.waits_for:
        who = (" and " if blocked.on == "future" else " or ").join(   # (futures: each runs one)
            _thread_words(state, pid, tid) for pid, tid in blocked.waits_for)
        alive = {(p.pid, tid) for p in state.processes for tid, _ in p.threads}
        ended = not any(w in alive for w in blocked.waits_for)   # (the graph says "(ended)")
        if blocked.on == "queue.join" and trace is not None:
            gone = _ended_getters(state, trace, blocked)
            if gone:
                return _join_never_done(state, blocked, gone, who)
            dropped = _dropped_words(state, blocked)
            if dropped:
                return f"{who} must call task_done() -- but " + dropped
            if _getters_want_more(state, trace, blocked):
                return _join_never_marked(state, blocked, who)
        must, sep, more = (blocked.must or st.MUST.get(blocked.on, 'must act')).partition("; ")
        if (blocked.pid, blocked.tid) in blocked.waits_for and blocked.on == "future":
            must += " -- and that thread is this one, waiting here"
        if ended and blocked.on == "queue.get" and trace is not None:
            lost = _puts_never_fed(state, trace, blocked)
            if lost:
                return lost
        if not ended and blocked.on == "queue.get" and trace is not None:
            dropped = _dropped_words(state, blocked)
            if dropped:
                return f"{who} must put -- and " + dropped
        if ended and blocked.on in ("thread_queue.get", "queue.get") and \
                not _ended_badly(state, trace, blocked.waits_for):
            return _putters_ended(state, blocked, who) + (
                _given_but_waiting(state, trace, blocked) if blocked.on == "queue.get" else "")
        return f"{who} {must}" + (
            f" -- but {'it has' if len(blocked.waits_for) == 1 else 'they have'} ended"
            if ended else _its_own_wait(state, blocked)) + sep + more + (
                "" if not ended or blocked.on != "pipe.recv" else
                PIPE_SENDERS_ENDED_WAIT if blocked.what.startswith("wait() on") else
                PIPE_SENDER_ENDED) + (_given_but_waiting(state, trace, blocked) if ended else "")
    if blocked.nobody:
        return blocked.nobody
    if blocked.on == "process":              # a child the trace does not record (Popen.wait)
        return "it must exit (a program mpviz does not record: its stack is not known)"
    name = state.channel_names.get(blocked.target, blocked.target)
    if blocked.on == "pipe.write":
        return f"someone must read {name}, and nobody has read it yet"
    if blocked.on == "queue.put":
        return f"someone must get from {name}, and nobody has got from it yet"
    if blocked.on == "pipe.recv":
        return f"someone must send into {name} (who holds its other end, the trace did not see)"
    if blocked.on == "pipe.send":
        return f"someone must recv from {name} (who holds its other end, the trace did not see)"
    if blocked.on == "queue.get":
        gone = st.gone_without_putting(trace, blocked.target, state.t_ns, blocked.pid) \
            if trace is not None else []
        return f"someone must put into {name}, and nobody has put into it yet" + \
            _gone_without_putting(gone, name) + _given_but_waiting(state, trace, blocked)
    if blocked.on.startswith("thread_queue."):                       # a queue.Queue's
        name = blocked.what.split(":")[0].split(" on ", 1)[-1]
        return (_put_into_their_own(state, trace, blocked, name)
                if blocked.on == "thread_queue.get" else
                f"someone must get from {name}, and no thread has got from it yet"
                if blocked.on == "thread_queue.put" else
                f"someone must get from {name} and call task_done(), and no thread has got "
                f"from it yet")
    if blocked.on == "barrier" and trace is not None:
        return _barrier_short(state, blocked, trace)
    if blocked.on in ("event", "condition") and trace is not None:
        return _signal_short(state, blocked, trace)
    return "who must act is not recorded"


# ... a Pipe's recv whose senders have all ended: why it is not an EOFError, and the fix
PIPE_SENDER_ENDED = (
    ". A recv() raises EOFError only once no process holds the Pipe's other end open any more "
    "-- and the process that made the Pipe holds both ends until it closes one. Fix: send "
    "what the receiver waits for on every path; and in the parent, after p.start(), close() "
    "the end given to the child, so that recv() raises EOFError instead of waiting for ever "
    "when the child ends without sending")
# ... the same for multiprocessing.connection.wait() over Pipe ends (the docs' example,
# whose comment says why the parent closes each w)
PIPE_SENDERS_ENDED_WAIT = (
    ". wait() reports a Pipe's end ready at its end of file (so that recv() raises EOFError) "
    "only once no process holds that Pipe's other end open any more -- and the process that "
    "made each Pipe holds both ends until it closes one. Fix: in the parent, after p.start(), "
    "close() the end given to the child (w.close()), so that each child is the only holder of "
    "its write end and wait() reports the read end ready when the child ends")


def _its_own_wait(state, blocked):
    """" (it waits for lock 'l', held by prog.py's main thread)": what the one thread a future
    waits for waits for itself, where the trace recorded it -- the next link of the chain."""
    if blocked.on != "future" or not blocked.waits_for or \
            (blocked.pid, blocked.tid) in blocked.waits_for:     # (its own wait: said already)
        return ""
    said = set()
    for pid, tid in blocked.waits_for:      # (several: a wait on many futures -- "each")
        said.add(_own_wait(state, pid, tid))
    if len(said) != 1 or "" in said:
        return ""
    it = "it" if len(blocked.waits_for) == 1 else "each"
    return f" ({it} waits{said.pop()})"


def _own_wait(state, pid, tid):
    """" for lock 'l', held by prog.py's main thread", ": get() on Queue 1 ...": what thread
    (pid, tid) waits for, where the trace recorded it; "" if not."""
    for lk in state.locks:
        if any((p, t) == (pid, tid) for p, t, _ in lk.waiters):
            owners = join_and([f"{state.labels.get(o.pid, o.pid)}'s {o.thread}"
                               for o in lk.owners])
            return f" for {lk.name or 'a lock'}" + (f", held by {owners}" if owners else "")
    for b in state.blocked:
        if (b.pid, b.tid) == (pid, tid):
            return f": {b.what}"
    return ""


NESTED_WAIT_FIX = ("a task that waits for a result of its own Pool holds a worker while it "
                   "waits; once every worker waits so, nobody is left to run the job. Fix: do "
                   "not wait for a Pool's results inside its tasks (return what the next step "
                   "needs and submit that step from the main program), or run the inner work in "
                   "a Pool of its own")


def _queued_job_words(state, blocked, submit, busy):
    """Job submitted, not started: which workers are busy, and whether the waiter is one."""
    job = blocked.target
    head = (f"no worker has started job {job}, submitted "
            f"{(state.t_ns - submit.ts_ns) / 1e9:.1f} s before")
    if not busy:
        return head + " (no worker of that Pool is running a task: is its Pool still running?)"
    runs = join_and([f"{_thread_words(state, e.pid, e.tid)} runs job {e.args.get('job')}"
                     for e in busy])
    text = f"{head}: the Pool's workers the trace saw are all busy ({runs})"
    if any((e.pid, e.tid) == (blocked.pid, blocked.tid) for e in busy):
        text += ", and this waiter is one of them: " + NESTED_WAIT_FIX
    return text


LOST_WAKEUP = ("a notify wakes only the threads already waiting. Fix: change what the waiter "
               "checks (under the Condition's lock) before notify(), and wait in a loop on it: "
               "`while not ready.value: cond.wait()`, or cond.wait_for(...)")


def no_hang_words(watchdog, ended, option, more=""):
    """What a run that ended by itself while its stacks were taken gets instead of a verdict.
    `ended`: "the program ended by itself (exit status 0) while mpviz took its stacks";
    `option`: "--hang-after" or "hang_after"; `more`: what mpviz did then."""
    return (f"no hang: {ended}, after {watchdog.stalled_for:.1f} s with no progress seen "
            f"({option} {watchdog.hang_after:g}){more}. A wait with a deadline longer than "
            f"{option} looks like a stall until it runs out; a longer {option} gives it the "
            f"time")


def _signal_short(state, blocked, trace):
    """Who must set an Event or notify a Condition, from their recorded set/clear/notify:
    nobody has yet; or one did, before this wait began, and woke nobody (the lost wake-up)."""
    name = blocked.what.rsplit(".wait", 1)[0] if blocked.what.endswith(("wait()", "wait_for()")) \
        else blocked.what
    signals = st.signals_before(trace, blocked.on, blocked.target, state.t_ns)
    gone = st.gone_without_signalling(trace, blocked.on, blocked.target, state.t_ns,
                                      blocked.pid)
    verb = "setting" if blocked.on == "event" else "notifying"
    never = "" if not gone else (
        f"; {join_and([w for w, _ in gone])} {'was' if len(gone) == 1 else 'were'} given "
        f"{name} (a Process argument) and ended ({'; '.join(h for _, h in gone)}) without "
        f"{verb} it: {'that' if len(gone) == 1 else 'those'} "
        f"{'set' if blocked.on == 'event' else 'notify'}{'' if len(gone) == 1 else 's'} "
        f"will never come")
    if blocked.on == "event":
        sets = [e for e in signals if e.kind == "event.set"]
        if not sets:
            return f"someone must set {name}, and nobody has set it yet" + never + \
                _set_another_event(state, blocked, trace)
        last = signals[-1]
        if last.kind == "event.clear":
            return (f"someone must set {name} again: {_thread_words(state, last.pid, last.tid)} "
                    f"cleared it after its last set()")
        return "who must act is not recorded"
    if not signals:
        return f"someone must notify {name}, and nobody has notified it yet" + never
    last = signals[-1]
    how = "notify_all()" if last.args.get("all") else "notify()"
    who = _thread_words(state, last.pid, last.tid)
    if blocked.what.endswith(".wait_for()") and last.ts_ns < blocked.since_ns:   # (its `via`)
        return (f"someone must make its wait_for() condition true and notify {name} again; "
                f"its last {how}, by {who}, came {(blocked.since_ns - last.ts_ns) / 1e9:.1f} s "
                f"before this wait began, and wait_for() checked its condition after it and "
                f"found it false")
    if last.ts_ns < blocked.since_ns:
        return (f"someone must notify {name} again; its last {how}, by {who}, came "
                f"{(blocked.since_ns - last.ts_ns) / 1e9:.1f} s before this wait began and "
                f"woke {_waiting_words(last.args.get('waiting'))}: " + LOST_WAKEUP)
    return f"someone must notify {name} again (its last {how} was by {who})"


def _set_another_event(state, blocked, trace):
    """An Event nobody set, while another process set an Event nobody ever waited on: said, as
    a fact. Where the waiter was started by spawn or forkserver and was not given its Event as
    a Process argument, the likely story too: the one module-level ``mp.Event()``, made again
    when the child imported the program's module (tests/hang_programs/spawn_global_event.py);
    where it was given it, that it was (wrong_event_set.py: the parent set another).
    '' when no other Event was set."""
    seen = trace.of_kind("wait.begin", "event.set", "process.launch")
    waited = {e.args.get("id") for e in seen if e.kind == "wait.begin" and
              e.args.get("on") == "event"}
    other = [e for e in seen if e.kind == "event.set" and e.pid != blocked.pid and
             e.ts_ns <= state.t_ns and e.args.get("id") not in waited]
    if not other:
        return ""
    said = (f"; {_thread_words(state, other[0].pid, other[0].tid)} set an Event, but another "
            f"one, which nobody waits on")
    given = any(e.kind == "process.launch" and e.args.get("child") == blocked.pid and
                blocked.target in (e.args.get("queues") or ()) for e in seen)
    if given:
        return said + (f" -- {state.labels.get(blocked.pid, blocked.pid)} was given this one "
                       f"as a Process argument: set that one")
    how = {p.pid: p.how for p in trace.processes()}.get(blocked.pid)
    if how not in ("spawn", "forkserver"):
        return said
    return said + (f": most likely the same module-level Event, made again when this child "
                   f"(started by {how}) imported the program's module -- a child never sees "
                   f"another process's set() of it. Fix: make the Event under "
                   f"`if __name__ == \"__main__\":` and pass it to the child as a Process "
                   f"argument")


def _waiting_words(waiting):
    if waiting is None:
        return "only the threads waiting then"
    return "nobody" if waiting == 0 else f"only the {waiting} thread(s) waiting then"


def _barrier_short(state, blocked, trace):
    """A Barrier lets its waiters go when its `parties` threads wait at it: how many wait now,
    and how many more must come (who would, the trace does not know: any thread may)."""
    parties = next((e.args.get("parties") for e in trace.of_kind("wait.begin")
                    if e.args.get("on") == "barrier" and e.args.get("id") == blocked.target
                    and e.args.get("parties")), None)
    if not parties:
        return "who must act is not recorded"
    n = sum(1 for b in state.blocked if b.on == "barrier" and b.target == blocked.target)
    if n >= parties:
        return "who must act is not recorded"
    return (f"it lets its waiters go when {parties} wait at it, and {n} wait now: "
            f"{parties - n} more must call its wait() (which thread would, the trace does not "
            f"know; was it made for more parties than the program starts?)")


def _ended_getters(state, trace, blocked):
    """The threads that got from the queue a q.join() waits on whose process ended, not with
    status 0 (an exception, a signal): [(label, how it ended)] -- what each took last and
    did not mark task_done() never will be."""
    alive = {p.pid for p in state.processes}
    out = []
    for pid in dict.fromkeys(p for p, _ in blocked.waits_for):
        if pid in alive:
            continue
        how = st.how_it_ended(trace, pid)
        if how.startswith(("exit 0", "its exit status unknown")):
            continue
        out.append((str(state.labels.get(pid, pid)), how))
    return out


def _dropped_words(state, blocked):
    """"Process-1 put an item into Queue 1 that never reached it: its feeder thread could not
    pickle it (TypeError: ...) ..." for a q.join() or get() on a queue whose putter lives on;
    "" if no put into it was dropped (State.dropped: analysis.dropped_by_queue)."""
    dropped = state.dropped.get(blocked.target)
    if not dropped:
        return ""
    name = state.channel_names.get(blocked.target, blocked.target)
    who = join_and(list(dict.fromkeys(str(state.labels.get(pid, pid)) for pid, _ in dropped)))
    errors = "; ".join(dict.fromkeys(err for _, err in dropped if err))
    n = len(dropped)
    them = "it" if n == 1 else "them"
    return (f"{who} put {'an item' if n == 1 else f'{n} items'} into {name} that never reached "
            f"it: the feeder thread could not pickle {them} ({errors}) and dropped {them}, "
            f"after put() had returned -- the error is printed in the putting process, and "
            f"nothing is raised there. " + (
                "q.join() counts a dropped item unfinished for ever: nobody can get it, so "
                "nobody calls task_done() for it. " if blocked.on == "queue.join" else
                "What was dropped is not coming. ") +
            "Fix: " + st.PICKLE_FIX)


def _getters_want_more(state, trace, blocked):
    """Was every item put into the queue a q.join() waits on got (by the state's moment), and
    does every thread that got from it wait in a get() on it again? (An item its feeder could
    not send was never got: that q.join() waits for a put that failed, not a task_done().)"""
    getting = {(b.pid, b.tid) for b in state.blocked
               if b.on == "queue.get" and b.target == blocked.target}
    if not blocked.waits_for or not set(blocked.waits_for) <= getting:
        return False
    put, got = set(), set()
    for e in trace.of_kind("queue.put", "queue.get"):
        if e.args.get("queue") == blocked.target and e.ts_ns <= state.t_ns:
            (put if e.kind == "queue.put" else got).add(e.args.get("msg"))
    return bool(put) and put <= got


def _join_never_marked(state, blocked, who):
    """The end of a q.join() wait's line when the consumers got every item and wait for more:
    an item got was never marked task_done() (a worker that forgot it), and none will be."""
    name = state.channel_names.get(blocked.target, blocked.target)
    one = len(blocked.waits_for) == 1
    return (f"{who} must call task_done() -- but {'it' if one else 'they'} got every item put "
            f"into {name} and now {'waits' if one else 'wait'} in its get() for more: q.join() "
            f"ends when task_done() has been called once for each item put, and an item got "
            f"without a task_done() after it stays unfinished for ever. Fix: call "
            f"q.task_done() once for every item a worker gets, after handling it (in a "
            f"`finally:` if handling can fail)")


def _join_never_done(state, blocked, gone, who):
    """The end of a q.join() wait's line when a consumer ended with an error or a signal."""
    name = state.channel_names.get(blocked.target, blocked.target)
    one = len(gone) == 1
    return (f"{who} must call task_done(); but {join_and([w for w, _ in gone])} got from "
            f"{name} and ended ({'; '.join(h for _, h in gone)}): what "
            f"{'it' if one else 'each'} took last and did not mark task_done() never will be, "
            f"so q.join() waits for ever. Fix: call task_done() in a `finally:` (or catch the "
            f"error per item), so that an item that fails is done too")


def _puts_never_fed(state, trace, blocked):
    """What a get() waits for that was put and will never come: the puts of processes that
    ended, whose messages never reached the queue's pipe (analysis.unfed_puts) -- said with the
    feeder's error, and the fix. "" if there are none."""
    lost = st.unfed_puts(trace, blocked.target, state.t_ns)
    if not lost:
        return ""
    lost.sort(key=lambda pe: [int(part) if part.isdigit() else part     # (Process-2 before
                              for part in re.split(r"(\d+)", str(state.labels.get(pe[0], pe[0])))])
    # Process-10, whichever put first)
    name = state.channel_names.get(blocked.target, blocked.target)
    who = join_and([str(state.labels.get(pid, pid)) for pid, _ in lost])
    errors = list(dict.fromkeys(err for _, err in lost if err))
    one = len(lost) == 1
    its = "its" if one else "their"
    why = (f"{its} feeder thread{'' if one else 's'} could not pickle what was put "
           f"({'; '.join(errors)})" if errors else f"{its} feeder thread{'' if one else 's'} "
           f"never wrote it (the process ended first)")
    fix = " Fix: " + st.PICKLE_FIX if errors else ""
    quit_ = [] if errors else _left_by_os_exit(trace, [pid for pid, _ in lost])
    if quit_ and len(quit_) == len(lost):
        why += (f": {join_and(quit_)} left by os._exit(), which skips the interpreter's exit "
                f"-- where a Queue's feeder is joined and writes what is left")
        fix = (" Fix: return from the process's function (or sys.exit()), or call the queue's "
               "close() and join_thread() before os._exit()")
    return (f"{who} put into {name} and ended, but {its} message{'' if one else 's'} never "
            f"reached the queue's pipe: {why}. put() only hands the object to that thread and "
            f"returns; the feeder's error is printed in the putting process -- or not at all, "
            f"when that process is exiting by then. Nothing is coming.{fix}")


def _left_by_os_exit(trace, pids):
    """The labels of `pids` that ended without leaving their Process's _bootstrap (no
    ``process.exit`` of their own) and not by a signal (reaped with an exit code): os._exit()."""
    ended = {e.pid for e in trace.of_kind("process.exit")}
    procs = {p.pid: p for p in trace.processes()}
    labels = st.process_labels(trace)
    return [str(labels.get(pid, pid)) for pid in pids
            if pid not in ended and pid in procs and procs[pid].exitcode is not None and
            procs[pid].exitcode >= 0 and not procs[pid].signal]


def _given_but_waiting(state, trace, blocked):
    """"; Process-2 was given Queue 2 too, but waits itself (see its line): no put before that wait
    ends", or "": the processes given the queue a get waits on that have not put into it and
    wait themselves (in the terminate() hang, the worker kept waits for a read lock)."""
    if trace is None or blocked.on != "queue.get":
        return ""
    stuck = st.given_but_waiting(trace, blocked.target, state.t_ns, blocked.pid)
    if not stuck:
        return ""
    name = state.channel_names.get(blocked.target, blocked.target)
    one = len(stuck) == 1
    return (f"; {join_and(stuck)} {'was' if one else 'were'} given {name} too, but "
            f"{'waits' if one else 'wait'} itself (see its line): no put before that wait ends")


def _put_into_their_own(state, trace, blocked, name):
    """"someone must put into queue.Queue 1, and no thread has put into it yet" -- or, where
    other processes put into a queue.Queue none of their threads gets from (by the state's
    moment), that no thread *of its process* has, and who put into a copy of their own. Said
    alone, "no thread has put into it" sent a learner to look for a put() the child did make."""
    copies = st.puts_into_their_own(trace, blocked.pid, state.t_ns) if trace is not None else []
    if not copies:
        return f"someone must put into {name}, and no thread has put into it yet"
    who = join_and([state.labels.get(pid, f"pid {pid}") for pid in copies])
    copy = "a queue.Queue of its" if len(copies) == 1 else "queue.Queues of their"
    return (f"someone must put into {name}, and no thread of its process has put into it -- "
            f"{who} put into {copy} own (a queue.Queue lives in one process's memory)")


def _gone_without_putting(gone, name):
    """"; Process-1 was given Queue 1 (a Process argument) and ended (exit 1, after ...)
    without putting into it: that put will never come", or "" (nobody known)."""
    if not gone:
        return ""
    if len(gone) == 1:
        (who, how), = gone
        return (f"; {who} was given {name} (a Process argument) and ended ({how}) without "
                f"putting into it: that put will never come")
    return (f"; {join_and([who for who, _ in gone])} were given {name} (a Process argument) "
            f"and ended without putting into it ({'; '.join(f'{w}: {h}' for w, h in gone)}): "
            f"those puts will never come")


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
        self.watchdog = Watchdog(directory, hang_after or 0, self._pids,
                                 ignore=lambda: {self._tid})
        os.environ[_env_stacks()] = self.watchdog.stacks_dir   # spawned children show stacks
        _fork_children_show_stacks()
        self.verdict, self.interrupted, self._done = None, None, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mpviz-hang-watchdog",
                                        daemon=True)
        if hang_after:               # (none: only the stacks, for a Ctrl-C: ``on_interrupt``)
            self._thread.start()
        self._old_sigint = None
        if self._owner == threading.main_thread().ident:
            current = signal.getsignal(signal.SIGINT)
            if current is signal.default_int_handler:
                self._old_sigint = signal.signal(signal.SIGINT, self.on_interrupt)
            elif current in (signal.SIG_IGN, signal.SIG_DFL):   # nohup ... &, or killed by it
                self._old_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def on_interrupt(self, signum, frame):
        """Ctrl-C (a Jupyter cell's interrupt) in the block: the hang verdict's report first --
        each process's stacks (this one's from `frame`, where the SIGINT found it; its children's
        as each wrote them at the SIGINT, ``interrupt_stacks``), what each waited for just
        before, who must act -- then the KeyboardInterrupt, as always. ``record`` then ends the
        block's processes (``clean_up``) and raises it on."""
        import sys
        import time
        if self.verdict is not None:          # the hang watchdog's own SIGINT (``_fire``): it
            raise KeyboardInterrupt           # has said everything; this only wakes the block
        now = time.monotonic_ns()
        try:
            self.watchdog.trace.refresh()
            stacks = self.watchdog.capture_stacks(extra={os.getpid(): _own_stacks(frame)})
            stacks = interrupt_stacks(stacks, self.watchdog.stacks_dir)
            self.watchdog.trace.refresh()
            names = st.process_labels(self.watchdog.trace)     # "main", as in the pictures
            for pid, info in stacks.items():
                info["name"] = names.get(pid) or info["name"]
            ends = [e.ts_ns for e in self.watchdog.trace.of_kind("wait.end")
                    if e.args.get("error") == "KeyboardInterrupt"]
            at = min(ends + [now]) - 1            # just before the first wait it ended
            self.interrupted = interrupt_report(self.watchdog.trace, stacks, at, who="mpviz")
        except Exception as exc:                  # the KeyboardInterrupt comes whatever happens
            self.interrupted = f"mpviz: INTERRUPTED (Ctrl-C); no report ({exc!r})"
        print(self.interrupted, file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    @staticmethod
    def hide_handler(exc):
        """Cut ``on_interrupt``'s own frame off the end of the KeyboardInterrupt's traceback (in
        place: the ``with`` statement puts back the same chain): the learner's traceback ends
        at the line the Ctrl-C interrupted, as without mpviz."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            if tb.tb_next.tb_frame.f_code is Guard.on_interrupt.__code__:
                tb.tb_next = None
                break
            tb = tb.tb_next

    def clean_up(self):
        """After a Ctrl-C: end the processes started in the block (those the same Ctrl-C did
        not end) and remove the shared memory they left: the block has stopped."""
        import sys
        import time
        recorded = {p.pid for p in self.watchdog.trace.processes()}
        killed = kill_descendants(os.getpid(), recorded)
        deadline = time.monotonic() + 2.0
        while any(pid in killed for pid in descendants(os.getpid())) and \
                time.monotonic() < deadline:
            time.sleep(0.02)      # reaped by multiprocessing's next active_children(); bounded
        self.watchdog.trace.refresh()
        removed = session.remove_segments(self.watchdog.trace, wait=0.5)
        if killed or removed:
            print(f"mpviz: after the Ctrl-C, stopped {len(killed)} process(es) started in the "
                  f"block and removed {len(removed)} shared-memory segment(s) they left",
                  file=sys.stderr, flush=True)

    def _on_sigint(self, signum, frame):
        """SIGINT in a block started with SIGINT ignored or at its default action."""
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
        while not self._done.wait(POLL_SECONDS):
            try:
                if self.watchdog.poll():
                    self._fire()
                    return
            except Exception:       # a bug of mpviz's: said, and the block goes on unwatched
                import sys
                import traceback
                print("mpviz: the hang watchdog failed -- a bug in mpviz, not in your program "
                      "(please report it, with the lines below); it is off for the rest of "
                      "this record() block, which goes on.\n" +
                      "".join(traceback.format_exc(limit=-4)).rstrip(), file=sys.stderr,
                      flush=True)
                return

    def _fire(self):
        import faulthandler
        import threading
        import sys
        mine = os.path.join(self.watchdog.stacks_dir, f"{os.getpid()}.self.txt")
        private = lambda path, flags: os.open(path, flags | os.O_NOFOLLOW, 0o600)  # noqa: E731
        with open(mine, "w", opener=private) as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        with open(mine) as f:
            own = f.read().strip()
        own = "\n".join(block for block in own.split("\n\n") if "_fire" not in block) or own
        stacks = self.watchdog.capture_stacks(extra={os.getpid(): own})
        if self._done.is_set():         # the block ended by itself while the stacks were taken
            print("mpviz: " + no_hang_words(self.watchdog, "the record() block ended by "
                                            "itself while mpviz took the stacks", "hang_after"),
                  file=sys.stderr, flush=True)
            return
        kill_ns = time.monotonic_ns()
        killed = kill_descendants(os.getpid(), {p.pid for p in self.watchdog.trace.processes()})
        self.watchdog.record_verdict(stacks, killed, kill_ns)
        self.watchdog.trace.refresh()
        self.verdict = self.watchdog.verdict(stacks, killed).replace("mpviz trace: ", "mpviz: ")
        print(self.verdict, file=sys.stderr, flush=True)
        if not self._done.wait(1.0) and self._owner == threading.main_thread().ident:
            import signal as _signal
            _signal.pthread_kill(self._owner, _signal.SIGINT)   # wake a wait in the block

    def stop(self):
        """The block has ended: stop watching; give the environment (and SIGINT) back."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._old_sigint is not None:
            signal.signal(signal.SIGINT, self._old_sigint)
        from .launcher import _tidy
        _tidy(self.watchdog.directory)    # the stacks folder's empty files
        if self._old_env is None:
            os.environ.pop(_env_stacks(), None)
        else:
            os.environ[_env_stacks()] = self._old_env


def _own_stacks(frame):
    """This process's threads' stacks in faulthandler's words, the main thread's from `frame`
    (where a signal found it, not the handler's own frames), the guard's thread left out."""
    import sys
    import threading
    me = threading.get_ident()
    skip = {t.ident for t in threading.enumerate() if t.name == "mpviz-hang-watchdog"}
    blocks = []
    for ident, top in sys._current_frames().items():
        if ident in skip:
            continue
        top = frame if ident == me else top
        lines = [f"{'Current thread' if ident == me else 'Thread'} 0x{ident:016x} "
                 f"(most recent call first):"]
        while top is not None:
            lines.append(f'  File "{top.f_code.co_filename}", line {top.f_lineno} in '
                         f'{top.f_code.co_name}')
            top = top.f_back
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _env_stacks():
    from .autostart import ENV_STACKS
    return ENV_STACKS


_fork_hook = False


def _fork_children_show_stacks():
    """A forked child of a guarded block registers its stacks (once per process: at-fork hooks
    cannot be removed; outside a guarded block the variable is unset and it does nothing)."""
    global _fork_hook
    if not _fork_hook:
        os.register_at_fork(after_in_child=_in_forked_child)
        _fork_hook = True


def _in_forked_child():
    """A forked child inherits the block's SIGINT handler (``Guard.on_interrupt``), which is
    the recording process's: Python's own is put back first, then the stacks registered."""
    from . import autostart
    handler = signal.getsignal(signal.SIGINT)
    if getattr(handler, "__func__", None) is Guard.on_interrupt:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get(_env_stacks()):
        autostart.register_stacks()


# the helpers a program's processes share, by a word of their command line
HELPERS = ((b"resource_tracker", "Python's resource tracker"),
           (b"forkserver", "Python's fork server"), (b"shm_manager", "mpviz's shm manager"))


def helper_name(pid):
    """"Python's fork server" (resource tracker, mpviz's shm manager) if process `pid` is one
    by its command line, which the fork server's children share (a recorded process goes by
    its trace's name first); None for any other process, or one gone."""
    cmdline = _proc.cmdline(pid) or b""
    return next((name for word, name in HELPERS if word in cmdline), None)


def _shared_helper(pid):
    return helper_name(pid) is not None    # (gone: no helper left to spare)


def descendants(root):
    """Living (not zombie) descendants of process `root`, by parent pid in /proc."""
    children = {}
    for pid in _proc.pids():
        st = _proc.stat(pid)
        if _proc.alive(st):
            children.setdefault(st.ppid, []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


class SessionPids:
    """``SessionPids(sid)()``: the living (not zombie) processes of session `sid`, as
    ``session.session_pids`` finds them, for the watchdog's every look, at less cost: a process
    found outside the session is not read again while its pid stays in /proc (a process cannot
    join another session, only leave its own: setsid), so a look reads /proc's list and the
    stat of the session's processes and of new ones -- not the ~150 of a shared machine."""

    def __init__(self, sid):
        self.sid, self._outside = sid, set()

    def __call__(self):
        listed, out = set(_proc.pids()), []
        self._outside &= listed          # a pid gone from /proc may come back as anyone
        for pid in listed - self._outside:
            st = _proc.stat(pid)
            if st is None:
                continue                 # gone since it was listed
            if st.session != self.sid:
                self._outside.add(pid)
            elif _proc.alive(st):
                out.append(pid)
        return sorted(out)
