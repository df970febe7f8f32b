"""The controller: you are the scheduler of a run of real processes (``Stepper``).

    Stepper (your kernel)                         the run (a fresh process group)
    ---------------------                         ------------------------------
    listen on RUN_DIR/ctl.sock                    python -m mpviz.stepper._driver RUN_DIR
    io thread: accept, read messages:     ◀────── hello (a process), pause (a thread stopped
      hello / pause / name / EOF                  before an operation; see gate.py)
    choices(): settle, then list the paused threads, each with what it is about to do
    step(c):   send "go" to that one thread ────▶ it runs until its next stop (or blocks in
               then settle                        the OS: a lock someone holds, a full pipe)

Settling is how the controller knows the run has done what it can: no process of the run still
starting (each says hello at once), no thread of the run runnable (state R in /proc), and no new
message, for a short quiet time. Then every thread is either paused at a stop (a choice) or
blocked in the OS (shown as blocked: it waits for something only another thread can do).
No choice left and nothing runnable while the processes live = a deadlock: nobody can ever move
-- unless a thread waits for *time* (``time.sleep``, a wait with a timeout: /proc says so, see
``_TIME_ENDS``), or one still computes between two stops. Then time will move it, so the
choices offer "let time pass" (``op == "time"``), never a deadlock; and a stall after a
process of the run died of an error is that error (``_died``), not a deadlock -- unless live
threads wait in a circle, each for a lock the next one holds or for its end (``_lock_cycle``).

Each run lives in a private /tmp/mpviz-step-*, removed by ``close()`` (or, after a killed
kernel, by the next Stepper's ``_sweep``). Undo restarts the run and replays the same choices.
"""
import atexit
import json
import os
import pickle
import re
import selectors
import shutil
import socket
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import NamedTuple

from .. import _proc
from .. import viz
from ..scenarios._common import load_details
from ..trace import autostart, osview, session
from ..trace import trace as mtrace
from ..trace.names import human_bytes
from . import gate

QUIET_S = 0.02            # settled: nothing runnable and no message for this long
STEP_QUIET_S = 0.1        # after a step, until the thread stops again: a thread just woken
                          # may sleep a moment (a busy machine) before it runs on
DEADLOCK_QUIET_S = 0.4    # no choice and nothing runnable for this long: a deadlock
SETTLE_LIMIT_S = 20.0     # a spawned child may take seconds to import; never wait longer
RUNNING_CPU_S = 1.5       # nobody paused, a thread computing between two stops: once the run
                          # has used this much CPU time (not wall time: on a loaded machine a
                          # child still importing gets little of it), choices() offers to
                          # "let time pass" instead of waiting on
TIME_STEP_S = 5.0         # stepping "let time pass" waits at most this long for a change
REPLAY_TIME_S = 60.0      # undo/restart: how long time may take to bring the run to a stop
PIPE_BYTES = 65536        # a Linux pipe's default capacity
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_open = weakref.WeakSet()


class ChoiceError(ValueError):
    """Raised when a step names a thread that cannot step now; the message lists the choices."""


class Choice(NamedTuple):
    """A thread paused before an operation: ``step(choice)`` lets it do that operation."""
    index: int
    who: str              # "process/thread", e.g. "child/main"
    op: str               # the kind: "lock.acquire", "queue.put", ...; "time": nobody is
                          # paused, but this thread sleeps or computes -- stepping it lets
                          # time pass
    text: str             # "acquire lock L (held by main/library-worker)"
    pid: int
    tid: int

    @property
    def label(self):
        return f"{self.who}: {self.text}"

    def __repr__(self):
        return f"<{self.index}: {self.label}>"


class StepState(NamedTuple):
    """Where the run stands: each thread's status, each lock's holder, and mpviz.viz's State."""
    threads: list         # [(who, status)]: "paused before: ...", "blocked in: ...", "ended"
    locks: dict           # lock name -> holder ("main/library-worker") or None
    processes: list       # [(name, pid, "alive" | "ended (exit code 0)")]
    outcome: object
    steps: list           # the choices taken so far (their labels)
    viz: object           # mpviz.viz.state_at(trace): who holds what, waits, messages in flight

    def __str__(self):
        lines = [f"outcome: {self.outcome or 'running'}   ({len(self.steps)} steps taken)"]
        lines += [f"  {who:<28} {status}" for who, status in self.threads]
        lines += [f"  lock {n}: {'held by ' + h if h else 'free'}" for n, h in self.locks.items()]
        ended = [f"{n} ({s})" for n, _, s in self.processes if s != "alive"]
        if ended:
            lines.append("  ended: " + ", ".join(ended))
        return "\n".join(lines)

    _repr_pretty_ = lambda self, p, cycle: p.text(str(self))   # noqa: E731 (IPython)


def step(function, *args, **kwargs):
    """Run ``function(*args, **kwargs)`` stepped: returns a ``Stepper`` paused at its first stop.

    `function` must be importable (defined in a module, not a notebook cell): the run is a fresh
    interpreter, and spawned children import it too. `args` are pickled (plain data only)."""
    if not callable(function):
        raise TypeError(f"mpviz.step(function, ...) needs a function, not {type(function).__name__}")
    if getattr(function, "__module__", None) == "__main__" or "<locals>" in \
            getattr(function, "__qualname__", ""):
        raise ValueError(
            f"mpviz.step: {getattr(function, '__qualname__', function)!r} is defined in __main__ "
            f"(a notebook cell?) or inside a function; a fresh interpreter cannot import it. "
            f"Fix: define it at the top level of a module (a .py file) and import it from there.")
    for where, value in [(f"argument {i + 1}", a) for i, a in enumerate(args)] + \
            [(f"argument {k}=", v) for k, v in kwargs.items()]:
        try:
            pickle.dumps(value)
        except Exception as exc:
            kind = "an open file" if hasattr(value, "fileno") and hasattr(value, "read") \
                else f"a {type(value).__name__}"
            raise TypeError(
                f"mpviz.step: {where} ({kind}) cannot travel to the stepped run: the run is a "
                f"fresh interpreter, which gets the arguments pickled, and pickle says: {exc}. "
                f"Fix: pass plain data (an open file: its path, f.name, and open it inside "
                f"{getattr(function, '__name__', 'the function')}).") from None
    return Stepper(("function", function, args, kwargs))


class Stepper:
    """A stepped run of real processes; see the module's top. Use it in a ``with`` block, or call
    ``close()``: that ends every process of the run and removes what it left."""

    def __init__(self, what, verdict=None, title=None):
        self._what, self._verdict, self.title = what, verdict, title
        pickle.dumps(what)                        # fails here, in the caller, if it cannot travel
        self.history = []                         # labels of the choices taken, in order
        self._launch()

    # --- starting and ending a run ---------------------------------------------------------

    def _launch(self):
        _sweep()
        self._dir = tempfile.mkdtemp(prefix=_PREFIX)       # private: 0700
        with open(os.path.join(self._dir, "owner"), "w") as f:
            f.write(_identity(os.getpid()))                # who removes it (see _sweep)
        self.trace_dir = os.path.join(self._dir, "trace")
        with open(os.path.join(self._dir, "run.pickle"), "wb") as f:
            pickle.dump(self._what, f)
        self._cv = threading.Condition()
        self._procs, self._threads, self._waiting, self._names = {}, {}, {}, {}
        self._auto, self._conn_of = {}, {}
        self._free, self._closing, self._outcome, self.explanation = False, False, None, None
        self._last_msg, self._order = time.monotonic(), 0
        self._stable = False                      # settled, and nothing happened since
        self._listed = []                         # what choices() last returned
        self._holders_cache = (None, {})          # (events seen, threads known) -> holders
        self._trace = mtrace.Trace(self.trace_dir)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(os.path.join(self._dir, "ctl.sock"))
        self._listener.listen(64)
        env = dict(os.environ)
        env[gate.ENV] = os.path.join(self._dir, "ctl.sock")
        env[autostart.ON_BOOT] = gate.BOOT        # each spawned child of the run steps itself
        env["MPVIZ_PURE_PYTHON"] = "1"            # every put and get through the Python hooks
        env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [os.path.abspath(p) for p in sys.path])
        for key in ("MPVIZ_TRACE_DIR", "MPVIZ_TRACE_THREADING_LOCKS"):
            env.pop(key, None)
        self._output = open(os.path.join(self._dir, "output.txt"), "wb")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mpviz.stepper._driver", self._dir], env=env, cwd=self._dir,
            stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True)
        self._io = threading.Thread(target=self._serve, name="mpviz-stepper-io", daemon=True)
        self._io.start()
        _open.add(self)

    def close(self):
        """End every process of the run (paused or blocked), remove its files; idempotent."""
        if self._closing:
            return
        finished = self._proc.poll() is not None
        session.kill_session(self._proc.pid, self._proc, graceful=finished)
        self._closing = True
        self._io.join(5)
        self._output.close()
        try:
            self._trace.refresh(final=True)
        except FileNotFoundError:
            pass
        session.remove_segments(self._trace, wait=0.5)
        self._trace._detach()
        shutil.rmtree(self._dir, ignore_errors=True)
        _open.discard(self)
        if self._outcome is None:
            self._outcome = "stopped"
            self.explanation = "Closed before the run ended; every process of it was ended."

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def restart(self, replay=()):
        """Close this run, start it again and replay `replay` (labels or who's), step by step."""
        self.close()
        self.history = []
        self._launch()
        for choice in replay:
            if choice.endswith(_LET_TIME_PASS):
                self.step(choice)    # (nothing to wait for if time has moved the run already)
                continue
            self._until_a_stop(choice)
            self.step(_who_of(choice))
        return self

    def _until_a_stop(self, label):
        """Replaying: let time pass while nobody is paused at a stop (the first run got to the
        stop `label` names by time alone, while the learner read the choices)."""
        deadline = time.monotonic() + REPLAY_TIME_S
        while True:
            choices = self.choices()
            if not choices or any(c.op != "time" for c in choices):
                return
            if time.monotonic() > deadline:
                raise ChoiceError(
                    f"replaying {label!r}: after {REPLAY_TIME_S:.0f} s of letting time pass, "
                    f"nobody is paused at a stop yet (the run is not the same as the one that "
                    f"took that step: it depends on time). Fix: step it by hand (s.choices()).")
            self._let_time_pass()

    def undo(self):
        """Take back the last step: restart the run and replay every step but the last.

        (A run cannot be rewound; it is deterministic at the stops, because between two stops
        only one thread of the run moves.)"""
        if not self.history:
            raise ChoiceError("nothing to undo: no step taken yet")
        return self.restart(self.history[:-1])

    # --- the io thread: messages from the run --------------------------------------------------

    def _serve(self):
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        buffers = {}
        try:
            while not self._closing:
                for key, _ in sel.select(0.05):
                    if key.data is None:
                        conn, _ = self._listener.accept()
                        buffers[conn] = b""
                        sel.register(conn, selectors.EVENT_READ, conn)
                        continue
                    conn = key.data
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(conn)
                        buffers.pop(conn, None)
                        self._gone(conn)
                        conn.close()
                        continue
                    buffers[conn] += data
                    *lines, buffers[conn] = buffers[conn].split(b"\n")
                    for line in lines:
                        self._message(conn, json.loads(line))
        finally:
            for conn in buffers:
                conn.close()
            sel.close()
            self._listener.close()

    def _message(self, conn, msg):
        with self._cv:
            self._last_msg, self._stable = time.monotonic(), False
            kind = msg["t"]
            if kind == "hello":
                self._procs[msg["pid"]] = dict(ppid=msg["ppid"], how=msg["how"], alive=True,
                                               order=len(self._procs))
                self._names.update(msg.get("names") or {})
                self._conn_of[conn] = ("process", msg["pid"])
            elif kind == "name":
                self._names[msg["obj"]] = msg["name"]
            elif kind == "pause":
                key = (msg["pid"], msg["tid"])
                if key not in self._threads:
                    self._order += 1
                    self._threads[key] = dict(order=self._order, last=None, alive=True)
                self._threads[key]["who"] = msg["who"]
                self._conn_of[conn] = ("thread", key)
                if self._free:
                    self._threads[key]["last"] = msg
                    conn.sendall(b"go\n")
                else:
                    self._waiting[key] = dict(msg, conn=conn)
            self._cv.notify_all()

    def _gone(self, conn):
        with self._cv:
            self._last_msg, self._stable = time.monotonic(), False
            what, key = self._conn_of.pop(conn, (None, None))
            if what == "process":
                self._procs[key]["alive"] = False
            elif what == "thread":
                self._threads[key]["alive"] = False
                self._waiting.pop(key, None)
            self._cv.notify_all()

    # --- settling ------------------------------------------------------------------------------

    def _busy(self):
        """Is anything of the run still moving: a process not yet started, a thread runnable?"""
        starting, running = self._activity()
        return starting or bool(running)

    def _activity(self):
        """(starting, running): is a process of the run still starting (each says hello first
        thing), and which threads of the run are runnable ([(pid, tid)], state R or D)."""
        running = []
        for pid in session.session_pids(self._proc.pid):
            if pid not in self._procs and not _is_helper(pid):
                return True, running
            for tid in _proc.threads(pid) or ():           # None: gone meanwhile
                st = _proc.stat(pid, tid)
                if st is not None and st.state in ("R", "D"):
                    running.append((pid, tid))
        return False, running

    def _moved_by_time(self):
        """[(pid, tid, what)]: the threads of the run that time will move -- computing between
        two stops ("running"), or in ``time.sleep`` or a wait with a timeout (``_TIME_ENDS``)."""
        starting, running = self._activity()
        out = [(pid, tid, "running") for pid, tid in running]
        for pid in session.session_pids(self._proc.pid):
            if pid not in self._procs:               # a helper (resource tracker, fork server)
                continue
            for view in osview.threads(pid):             # []: gone meanwhile
                what = _TIME_ENDS.get(view.wait)
                if what is not None and (view.pid, view.tid) not in running:
                    out.append((view.pid, view.tid, what))
        return out

    def _settle(self, quiet=QUIET_S, until=None):
        """Wait until the run has done all it can without a step (see the top). `until`: return
        as soon as it is true (checked under the lock). While nobody is paused, a thread that
        computes on between two stops is waited for RUNNING_CPU_S of CPU time (then choices()
        offers to let time pass); otherwise, up to SETTLE_LIMIT_S."""
        deadline, calm_since, cpu_at = time.monotonic() + SETTLE_LIMIT_S, None, None
        if self._stable and until is None and quiet == QUIET_S:
            return                  # nothing moves between two steps: settled stays settled
        while time.monotonic() < deadline and not self._closing:
            if self._proc.poll() is not None:
                return
            with self._cv:
                if until is not None and until():
                    return
                last = self._last_msg
            now = time.monotonic()
            starting, running = self._activity()
            with self._cv:
                paused = bool(self._waiting)
            if running and not starting and not paused and now - last >= QUIET_S:
                cpu = session.session_cpu(self._proc.pid)
                cpu_at = cpu if cpu_at is None else cpu_at
                if cpu - cpu_at >= RUNNING_CPU_S:
                    return          # computing: choices() says so, and offers to wait on
            else:
                cpu_at = None
            if now - last < QUIET_S or starting or running:
                calm_since = None
            elif calm_since is None:
                calm_since = now
            elif now - calm_since >= quiet:
                with self._cv:
                    self._stable = self._last_msg == last
                return
            with self._cv:
                self._cv.wait(0.003)

    # --- what the learner uses ---------------------------------------------------------------

    def choices(self):
        """The threads that can take a step now, each with what it is about to do."""
        self._settle()
        self._judge_if_over()
        if self._outcome is not None:
            return []
        holders = self._holders()
        with self._cv:
            waiting = sorted(self._waiting.values(), key=self._sort_key)
            if waiting:
                self._listed = [Choice(i, m["who"], m["op"], self._describe(m, holders),
                                       m["pid"], m["tid"]) for i, m in enumerate(waiting)]
                return self._listed
        self._listed = self._time_choices()
        return self._listed

    def _time_choices(self):
        """Nobody is paused at a stop, but time will move someone: one "let time pass" choice
        per such thread (stepping any of them waits; see ``_let_time_pass``)."""
        names = {pid: name for name, pid, _ in self.state_processes()}
        out = []
        for pid, tid, what in self._moved_by_time():
            with self._cv:
                known = self._threads.get((pid, tid))
            who = known["who"] if known else (
                f"{names.get(pid, pid)}/{'main' if pid == tid else f'thread {tid}'}")
            text = {"running": "running: it computes between two stops",
                    "sleeping": "sleeping (time.sleep): it waits for time, not for another "
                                "thread"}.get(what, f"{what}: it waits for time (or for another "
                                                    f"thread, whichever comes first)")
            out.append(Choice(len(out), who, "time", text + _LET_TIME_PASS, pid, tid))
        return out

    def _sort_key(self, m):
        proc = self._procs.get(m["pid"], {}).get("order", 1 << 30)
        return proc, self._threads[(m["pid"], m["tid"])]["order"]

    def step(self, choice):
        """Let one paused thread do its next operation: `choice` is a Choice, its index, its
        label (or the start of it: "child/main: acquire lock A"), or its who ("child/main").
        Returns the choices after the step."""
        if not isinstance(choice, Choice) and any(c.op == "time" for c in self._listed):
            # what the learner saw: time may have brought a thread to a stop since, and
            # step(0) is still "let time pass" (never that stop, which was not listed)
            try:
                choice = _pick(choice, self._listed, self._outcome)
            except (ChoiceError, TypeError):
                pass
        if isinstance(choice, Choice) and choice.op == "time" or \
                isinstance(choice, str) and choice.endswith(_LET_TIME_PASS):
            # (time may have moved the run already: then there is nothing left to wait for)
            choices = self.choices()
            if not any(c.op == "time" for c in choices):
                return choices
        else:
            choices = self.choices()
        picked = _pick(choice, choices, self._outcome, self._why_not)
        if picked.op == "time":
            self.history.append(picked.label)
            self._let_time_pass()
            return self.choices()
        ended = _process_end(picked.pid)
        if ended is not None:            # killed since the choices were listed (from outside)
            raise ChoiceError(self._ended_words(picked.who, picked.pid, ended) + " Nothing "
                              "was stepped. Fix: step another choice (s.choices() lists them).")
        with self._cv:
            m = self._waiting.pop((picked.pid, picked.tid), None)
            if m is None:
                raise ChoiceError(f"{picked.label!r} is no longer paused (its process ended)")
            self._threads[(picked.pid, picked.tid)]["last"] = m
            self.history.append(picked.label)
            key = (picked.pid, picked.tid)
            self._stable = False
            m["conn"].sendall(b"go\n")
        # until that thread stops again or ends; or, if it blocks in the OS, the run is calm
        self._settle(quiet=STEP_QUIET_S,
                     until=lambda: key in self._waiting or not self._threads[key]["alive"])
        self._settle()
        return self.choices()

    def _why_not(self, choice):
        """"who cannot step: its process (pid N) has ended (killed by SIGKILL) ... " when
        `choice` (a Choice, or a label or who) names a thread whose process has ended."""
        if isinstance(choice, Choice):
            found = [(choice.who, choice.pid)]
        elif isinstance(choice, str):
            with self._cv:
                found = [(t["who"], pid) for (pid, _), t in self._threads.items()
                         if t.get("who") == _who_of(choice)]
        else:
            return ""
        for who, pid in found:
            ended = _process_end(pid)
            if ended is not None:
                return self._ended_words(who, pid, ended) + " "
        return ""

    def _ended_words(self, who, pid, ended):
        how = "" if ended == "ended" else f" ({ended})"
        return (f"{who} cannot step: its process (pid {pid}) has ended{how}, so that thread "
                f"will never do its next operation.")

    def _let_time_pass(self):
        """The step "let time pass": wait (at most TIME_STEP_S) until a thread stops at its
        next operation, a process ends, a thread that slept has woken (and run: its count of
        context switches moved), or nobody sleeps or computes any more."""
        deadline = time.monotonic() + TIME_STEP_S
        with self._cv:
            self._stable = False
            procs = sum(p["alive"] for p in self._procs.values())
        asleep = {}         # (pid, tid) of each sleeper -> its context switches when it slept
        moved = self._moved_by_time()
        while True:
            # (a thread that was running as the step began -- between two sleeps, on a busy
            # machine -- is watched from its next sleep: its waking ends the step, not the 5 s)
            for pid, tid, what in moved:
                if what != "running" and (pid, tid) not in asleep:
                    asleep[pid, tid] = _switches(pid, tid)
            if time.monotonic() >= deadline or self._closing or self._proc.poll() is not None:
                break
            with self._cv:
                if self._waiting or sum(p["alive"] for p in self._procs.values()) != procs:
                    break
                self._cv.wait(0.05)
            moved = self._moved_by_time()
            if not moved:
                break
            if any(_switches(pid, tid) != n for (pid, tid), n in asleep.items()):
                break
        self._settle()

    def run_until(self, predicate, choose=None, max_steps=10000):
        """Step until ``predicate(self)`` is true or the run is over; `choose(choices)` picks each
        step (default: the first choice). Returns the outcome (None: still running)."""
        for _ in range(max_steps):
            if predicate(self):
                break
            choices = self.choices()
            if not choices:
                break
            self.step(choose(choices) if choose else choices[0])
        return self.outcome

    def run_freely(self, timeout=60):
        """Stop stepping: every thread runs without waiting; returns the outcome."""
        with self._cv:
            self._free, self._stable = True, False
            for key, m in list(self._waiting.items()):
                self._threads[key]["last"] = m
                m["conn"].sendall(b"go\n")
            self._waiting.clear()
        deadline = time.monotonic() + timeout
        while self.outcome is None and time.monotonic() < deadline:
            pass                                  # (each look at outcome waits to settle)
        return self._outcome

    @property
    def outcome(self):
        """None while running; "ok" (all ended), "deadlock" (nobody can ever move again),
        "error" (a process failed), "stopped" (closed before the run ended), or a puzzle's own
        verdict. ``explanation`` says why."""
        if self._outcome is None and not self._closing:
            self._settle()
            self._judge_if_over()
        return self._outcome

    def _judge_if_over(self):
        """Set the outcome once the run is over: all ended, or stuck for good (see the top)."""
        if self._outcome is not None or self._closing:
            return
        if self._proc.poll() is None:
            with self._cv:
                if self._waiting:
                    return                        # someone can step: still running
            if self._activity()[1]:
                return                            # someone computes: not over, not stuck
            self._settle(quiet=DEADLOCK_QUIET_S, until=lambda: bool(self._waiting))
            with self._cv:
                if self._waiting:
                    return
            if self._proc.poll() is None:
                # still computing after the limit, or waiting for time: not over
                if not self._busy() and not self._moved_by_time():
                    self._deadlock()
                return
        self._finish()

    def _deadlock(self):
        with self._cv:
            blocked = [t["who"] for t in self._threads.values() if t["alive"]] or \
                [f"{n}/main" for n, _, s in self.state_processes() if s == "alive"]
        died = self._died()
        if died and not self._lock_cycle():
            # a process of the run died of an error; the others wait for what it would have done
            self._outcome = "error"
            self.explanation = (f"{died} The run can never finish: " + ", ".join(blocked) +
                                " wait(s) in the OS for what it would have done (a stall caused "
                                "by that death, not a deadlock between the others).")
        else:
            self._outcome = "deadlock"
            self.explanation = ("No thread can take a step, and the processes are alive: "
                                + ", ".join(blocked) + " wait(s) in the OS for something that "
                                "only another of them could do. Nobody will ever move again."
                                + (f" (Besides: {died})" if died else ""))
        self._apply_verdict()

    def _lock_cycle(self):
        """The live threads that wait in a circle, each for a lock the next one holds or for the
        next one's process to end (a join), e.g. ["main/main", "worker/main"]; or []: a
        deadlock between them, whoever else has died."""
        holders = self._holders()
        waits_for = {}
        with self._cv:
            for (pid, _), t in self._threads.items():
                m = t.get("last")
                if not t["alive"] or m is None:
                    continue
                if m["op"] == "lock.acquire":
                    obj = m.get("obj")
                    holder = holders.get((obj, pid if obj and _THREAD_LOCK.match(obj) else None))
                    if holder is not None and holder != t["who"]:
                        waits_for[t["who"]] = holder
                elif m["op"] == "process.join":
                    waits_for[t["who"]] = f"{(m.get('info') or {}).get('name')}/main"
        for who in waits_for:
            path = []
            while who in waits_for and who not in path:
                path.append(who)
                who = waits_for[who]
            if who in path:
                return path[path.index(who):]
        return []

    def _died(self):
        """Words for the processes of the run that ended badly (an exception, a signal), or ""."""
        out = []
        output = self._read_output()
        for name, pid, status in self.state_processes():
            if status in ("alive", "ended") or "exit code 0" in status:
                continue                       # ("ended": how is not known)
            error = _last_exception(output, name)
            out.append(f"Process {name} (pid {pid}) {status}" +
                       (f", of {error}." if error else "."))
        return " ".join(out)

    def _finish(self):
        details = self.details()
        processes = self.state_processes()
        failed = [f"{n} ({s})" for n, _, s in processes
                  if "exit code 0" not in s and s not in ("alive", "ended")]
        unknown = [n for n, _, s in processes if s == "ended"]   # (not said to have failed)
        if self._proc.returncode < 0 and not details.get("error"):
            # killed (SIGKILL from the OOM killer, a kill from outside): no exception to show
            self._outcome = "error"
            self.explanation = (f"The program's main process was killed by "
                                f"{_signal_name(-self._proc.returncode)}: it raised "
                                f"nothing, it was ended from outside (the OOM killer sends "
                                f"SIGKILL).")
        elif self._proc.returncode != 0 or details.get("error"):
            self._outcome = "error"
            self.explanation = ("The program raised an exception:\n"
                                + (details.get("error") or self._read_output()[-2000:]))
        elif failed:
            self._outcome = "error"
            self.explanation = "The run ended, but not every process ended well: " + \
                ", ".join(failed)
        else:
            self._outcome = "ok"
            self.explanation = "Every process ended normally." if not unknown else (
                f"Every process whose end was recorded ended normally; how "
                f"{', '.join(unknown)} ended was not recorded.")
        self._apply_verdict()

    def _apply_verdict(self):
        if self._verdict is not None:
            self._outcome, self.explanation = self._verdict(self._outcome, self.explanation,
                                                            self.details())

    def details(self):
        """What the program observed (a puzzle writes its observations here)."""
        return load_details(os.path.join(self._dir, "details.json"))

    def _read_output(self):
        return session.read_text(os.path.join(self._dir, "output.txt"))

    @property
    def output(self):
        """What the run's processes printed."""
        return self._read_output()

    @property
    def trace(self):
        """The events recorded so far (an mpviz.trace.Trace, refreshed)."""
        if not self._closing:
            try:
                self._trace.refresh()
            except FileNotFoundError:
                pass
        return self._trace

    def state(self):
        """Who is paused before what, who is blocked in what, who holds which lock; plus
        ``viz``: mpviz.viz.state_at(trace) (waits, messages in flight, segments)."""
        self._settle()
        holders = self._holders()
        threads = []
        with self._cv:
            for key, t in sorted(self._threads.items(), key=lambda kv: (
                    self._procs.get(kv[0][0], {}).get("order", 0), kv[1]["order"])):
                if key in self._waiting:
                    status = "paused before: " + self._describe(self._waiting[key], holders)
                elif not t["alive"] or not self._procs.get(key[0], {}).get("alive"):
                    status = "ended"
                elif t["last"] is not None:
                    status = _blocked_status(key, t["last"]["op"],
                                             self._describe(t["last"], holders))
                else:
                    status = "running"
                threads.append((t["who"], status))
        locks = {}
        for (lid, pid), who in holders.items():
            locks[self._name(lid, "lock").split(" ", 1)[1] + (f" (copy in pid {pid})" if pid else "")] = who
        return StepState(threads, locks, self.state_processes(), self._outcome,
                         list(self.history), viz.state_at(self.trace))

    def wait_for(self):
        """mpviz.viz.wait_for of the run now, its locks called as the choices call them
        ("lock A", not the semaphore's name); returns the Figure."""
        import matplotlib.text
        trace = self.trace.snapshot()
        fig = viz.wait_for(trace)
        names = {}
        for e in trace.events:
            if e.kind.startswith("lock.") and e.args.get("lock"):
                lid = e.args["lock"]
                names[lid] = self._name(lid, "lock").split(" ", 1)[1]
                # the picture may call it as viz does ("Lock 2", "lock 'second'"): say "lock B"
                names[viz.lock_name(trace, lid)] = "lock " + names[lid]
        for text in fig.findobj(matplotlib.text.Text):
            words = text.get_text()
            for lid in sorted(names, key=len, reverse=True):
                words = words.replace(lid, names[lid])
            if words != text.get_text():
                text.set_text(words)
        return fig

    def state_processes(self):
        """[(name, pid, status)] for every process of the run that said hello."""
        info = {p.pid: p for p in self.trace.processes()}
        out = []
        with self._cv:
            procs = sorted(self._procs.items(), key=lambda kv: kv[1]["order"])
        for pid, p in procs:
            t = info.get(pid)
            name = (t.name if t and t.name else str(pid))
            name = "main" if name == "MainProcess" else name
            if p["alive"]:
                status = "alive"
            elif t is not None and t.signal:
                status = f"ended (killed by {t.signal})"
            elif t is not None and t.exitcode is not None:
                status = f"ended (exit code {t.exitcode})"
            elif pid == self._proc.pid and self._proc.returncode is not None:
                status = f"ended (exit code {self._proc.returncode})"
            else:                             # unrecorded: /proc, while it is a zombie
                end = _process_end(pid)
                status = "ended" if end in (None, "ended") else f"ended ({end})"
            out.append((name, pid, status))
        return out

    # --- words for the choices -------------------------------------------------------------------

    def _name(self, obj, kind):
        if obj is None:
            return kind
        if obj in self._names:
            return f"{kind} {self._names[obj]}"
        if obj not in self._auto:            # unnamed: numbered in order of appearance
            self._auto[obj] = (kind, sum(1 for k in self._auto.values() if k[0] == kind) + 1)
        return f"{kind} #{self._auto[obj][1]}"

    def _holders(self):
        """(lock id, pid or None) -> who holds it, read off the recorded lock events. A threading
        lock is per process (a fork copies it, held or not: pid is the copy's process); a
        multiprocessing lock is one lock for all (pid None)."""
        events = self.trace.events
        key = (len(events), len(self._threads))
        if getattr(self, "_holders_cache", (None,))[0] == key:
            return self._holders_cache[1]
        held = {}
        whos = {}
        with self._cv:
            for (pid, tid), t in self._threads.items():
                whos[(pid, tid)] = t["who"]
        for e in events:
            if e.kind == "process.start" and e.args.get("how") == "fork":
                for (lid, pid), h in list(held.items()):
                    if pid == e.args.get("ppid"):
                        held[(lid, e.pid)] = h
            elif e.kind in ("lock.acquire", "lock.release"):
                lid = e.args["lock"]
                key = (lid, e.pid if _THREAD_LOCK.match(lid) else None)
                if e.kind == "lock.acquire":
                    held[key] = (e.pid, e.tid)
                else:
                    held.pop(key, None)
        result = {k: whos.get(h, f"pid {h[0]} thread {h[1]}") + (
            "" if k[1] is None or h[0] == k[1] else " (a thread of the parent)")
            for k, h in held.items()}
        self._holders_cache = (key, result)
        return result

    def _describe(self, m, holders):
        op, obj, info = m["op"], m.get("obj"), m.get("info") or {}
        if op == "lock.acquire":
            key = (obj, m["pid"] if obj and _THREAD_LOCK.match(obj) else None)
            holder = holders.get(key)
            if holder is None:
                return f"acquire {self._name(obj, 'lock')} (free)"
            if holder.endswith("(a thread of the parent)"):
                holder = holder[:-len(" (a thread of the parent)")]
                return (f"acquire {self._name(obj, 'lock')} (held by {holder}: the copy fork "
                        f"made of it, whose holder was not copied -- nobody here can release it)")
            return f"acquire {self._name(obj, 'lock')} (held by {holder})"
        if op == "lock.release":
            return f"release {self._name(obj, 'lock')}"
        if op == "queue.put":
            if info.get("direct"):               # mpviz's Queue: small messages go straight in
                return f"put an item on {self._name(obj, 'queue')} (written into its pipe " \
                       f"now if it fits, else its feeder thread writes it)"
            return f"put an item on {self._name(obj, 'queue')} (into its buffer: the feeder " \
                   f"thread writes it)"
        if op == "queue.get":
            return f"get an item from {self._name(obj, 'queue')}"
        if op == "shm.attach":
            return f"attach shared memory {obj.lstrip('/')} ({human_bytes(info.get('nbytes'))}" \
                   f"{self._arrived_by(m)})"
        if op == "queue.feed":
            n = info.get("nbytes", 0)
            more = (f": more than a pipe holds ({PIPE_BYTES // 1024} KiB), so the write waits "
                    f"for a reader" if n > PIPE_BYTES else "")
            return f"write {n:,} bytes into {self._name(obj, 'queue')}'s pipe{more}"
        if op == "process.start":
            return f"start process {info.get('name')}"
        if op == "process.join":
            return f"join process {info.get('name')} (wait until it has ended)"
        if op.startswith("event."):
            verb = {"event.set": "set", "event.clear": "clear", "event.wait": "wait for"}[op]
            return f"{verb} {self._name(obj, 'event')}"
        if op.startswith("condition."):
            verb = {"condition.wait": "wait on", "condition.notify": "notify",
                    "condition.notify_all": "notify all waiting on"}[op]
            more = " (releases its lock, sleeps until notified)" if op == "condition.wait" else ""
            return f"{verb} {self._name(obj, 'condition')}{more}"
        if op == "pipe.send":
            return "send on a pipe"
        if op == "pipe.recv":
            return "receive from a pipe (waits for a message)"
        if op == "point":
            return info.get("text", "point")
        return op

    def _arrived_by(self, m):
        """How the handle of a shared-memory attach came: ", from queue Q" (the thread's last
        step was a get from Q: it is unpickling what it got), ", from a pipe", or ", from its
        Process arguments" (a spawned child unpickling its Process); else nothing."""
        if (m.get("info") or {}).get("arguments"):
            return ", from its Process arguments"
        last = self._threads.get((m["pid"], m["tid"]), {}).get("last")
        if last is not None and last["op"] == "queue.get":
            return f", from {self._name(last.get('obj'), 'queue')}"
        if last is not None and last["op"] == "pipe.recv":
            return ", from a pipe"
        return ""

    def __repr__(self):
        return f"<Stepper {self.title or self._what[1]!s}: {self._outcome or 'running'}>"


_LET_TIME_PASS = " -- step it to let time pass"
_THREAD_LOCK = re.compile(r"^t\d+\.\d+$")     # locks.py's ids for threading locks

# What a thread blocked in the OS waits in: its system call (/proc/PID/task/TID/syscall; x86-64
# numbers), and the stops whose operation blocks in that call -- so that "blocked in: acquire
# lock B" is said only when the thread is still in that acquire, and otherwise the truth: blocked
# in some other call, after its last step (a child exiting waits for its feeder thread, say).
_SYSCALLS = {202: "futex: a lock, a semaphore or a thread's end", 1: "write: the pipe is full",
             0: "read: waiting for data", 61: "wait4: waiting for a child process to end",
             247: "waitid: waiting for a child process to end", 7: "poll: waiting for data",
             271: "ppoll: waiting for data", 23: "select: waiting for data",
             230: "sleeping", 35: "sleeping"}
_BLOCKS_IN = {"lock.acquire": 202, "event.wait": 202, "condition.wait": 202, "queue.get": 0,
              "pipe.recv": 0, "queue.feed": 1, "process.join": 61}


def _syscall(pid, tid):
    if os.uname().machine != "x86_64":
        return None
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _blocked_status(key, op, text):
    """What to say of a thread that took a step and is now blocked in the OS (see above)."""
    call = _syscall(*key)
    if call is not None and call == _BLOCKS_IN.get(op) or call is None and op in _BLOCKS_IN:
        return f"blocked in: {text}"
    what = _SYSCALLS.get(call, f"system call {call}") if call is not None else "the OS"
    return f"blocked in {what}; its last step: {text}"


def _switches(pid, tid):
    """How many times thread `tid` of `pid` has left the CPU (a sleeper that woke and ran
    adds at least one), from /proc/PID/task/TID/status; None once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    except (OSError, ValueError, IndexError):
        return None


# The waits that time ends by itself, as osview reads them from /proc/PID/task/TID/syscall (a
# sleep, or a wait given a timeout: a lock's, a poll's, a select's; its table of system calls).
_TIME_ENDS = {"sleep": "sleeping", "deadline": "waiting with a timeout"}


def _process_end(pid):
    """None while process `pid` lives; else how it ended ("killed by SIGKILL", "exit code 1",
    or "ended"): a zombie's /proc/PID/stat still holds its wait status (field 52)."""
    st = _proc.stat(pid)
    if st is None:
        return "ended"                     # gone (reaped): how, /proc cannot say any more
    if _proc.alive(st):
        return None
    status = st.exit_status
    if status is None:
        return "ended"
    if status & 0x7F:
        return f"killed by {_signal_name(status & 0x7F)}"
    return f"exit code {status >> 8}"


def _last_exception(output, name):
    """The last line of the traceback the stdlib printed for Process `name` ("Process name:"
    then a traceback), e.g. "MemoryError"; "" if there is none."""
    at = output.rfind(f"Process {name}:\nTraceback")
    if at < 0:
        return ""
    for line in output[at:].splitlines()[2:]:
        if line and not line.startswith(" "):
            return line.strip()[:300]
    return ""


def _is_helper(pid):
    """The stdlib's resource tracker and fork server: they never say hello."""
    cmd = _proc.cmdline(pid)
    if cmd is None:
        return True        # gone (or not ours): it will never say hello either, so wait for none
    return b"resource_tracker" in cmd or b"forkserver" in cmd


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:                    # a number Python has no name for (a real-time one)
        return f"signal {number}"


def _who_of(label):
    return label.split(": ", 1)[0] if isinstance(label, str) else label


def _pick(choice, choices, outcome, why_not=lambda choice: ""):
    """The Choice that `choice` names, or a ChoiceError that lists the choices (beginning with
    ``why_not(choice)``: the thread it names has ended, say)."""
    if isinstance(choice, Choice):
        for c in choices:
            if (c.pid, c.tid) == (choice.pid, choice.tid):
                return c
    elif isinstance(choice, int) and not isinstance(choice, bool):
        if 0 <= choice < len(choices):
            return choices[choice]
    elif isinstance(choice, str):
        # the whole label, the who ("child/main"), or the start of one label ("child/main:
        # acquire lock A": the part after "(" may change with who holds what)
        for test in (lambda c: c.label == choice, lambda c: c.who == choice,
                     lambda c: ": " in choice and c.label.startswith(choice)):
            found = [c for c in choices if test(c)]
            if len(found) == 1:
                return found[0]
    else:
        raise TypeError(f"step(choice): a Choice, its index or its label, not "
                        f"{type(choice).__name__}")
    if not choices:
        why = why_not(choice)
        raise ChoiceError(f"{why}{choice!r} cannot step: no thread can take a step now (the run's "
                          f"outcome: {outcome}).")
    why = why_not(choice)
    listed = "\n".join(f"  {c.index}: {c.label}" for c in choices)
    raise ChoiceError(f"{why}{choice!r} is not a choice now. The threads that can step are:\n{listed}\n"
                      f"Fix: pass one of these indexes or labels (a thread blocked in the OS, "
                      f"or one that ended, cannot step).")


# --- run directories left behind -------------------------------------------------------------

_PREFIX = "mpviz-step-"


def _identity(pid):
    """"PID START": a process, told apart from a later one given the same pid (its start time,
    in clock ticks since boot, field 22 of /proc/PID/stat); "" if it is gone."""
    start = _proc.start_time(pid)          # None: gone, or a zombie
    return "" if start is None else f"{pid} {start}"


def _sweep():
    """Remove the run directories of Steppers whose process is gone without closing them (a
    kernel killed, or interrupted hard). Only this user's, only real directories (never a
    symlink someone planted), only those whose ``owner`` file names a process that is not
    alive any more; a run's own processes end themselves when their controller goes (gate.py)."""
    top = tempfile.gettempdir()
    try:
        entries = os.listdir(top)
    except OSError:
        return
    for entry in entries:
        if not entry.startswith(_PREFIX):
            continue
        path = os.path.join(top, entry)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, "owner"), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                owner = f.read().strip()
        except (OSError, ValueError):
            continue                 # not ours, or no owner file (made before there was one)
        pid = owner.split(" ", 1)[0]
        if pid.isdigit() and _identity(int(pid)) != owner:
            shutil.rmtree(path, ignore_errors=True)


@atexit.register
def _close_all():
    for s in list(_open):
        try:
            s.close()
        except Exception:
            pass
