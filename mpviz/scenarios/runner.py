"""Running one scenario: the driver process, the watchdog, the cleanup, the verdict.

``Running`` starts ``python -m mpviz.scenarios._driver NAME PARAMS DIR`` in a session of its own
and returns at once; a watchdog thread in *this* process then looks after it::

    every 0.1 s:  the driver exited?                                → finish
                  the hang watchdog (trace/watchdog.py): every thread
                  waits for ever (no sleep, no timeout), STALL_SECONDS → stuck
                  past TIME_LIMIT, or stop() was called             → stop it
    stuck:   SIGUSR1 to each recorded process: faulthandler (registered in each by
             _site/sitecustomize.py) writes its stacks to DIR/.stacks/PID.txt; they become
             ``watchdog.stuck`` events with the watchdog's reason ("deadlock" or "stopped")
    always:  kill what is left of the session (resource trackers last, so that they unlink
             the semaphores they track), unlink the /dev/shm segments this run created that
             are still there; then load the trace and ask the case's ``verdict(trace, details)``

Why a session: every process the driver starts inherits its session id, even one re-parented
to init: "all processes of the run" is "all of the session" -- minus mpviz's shm manager, which
starts a session of its own on purpose (it serves every mpviz process of this user).

One watchdog: the judge is ``mpviz trace``'s own (``Watchdog.poll``), with STALL_SECONDS as its
``--hang-after``; the session's helpers (list, kill, stacks, segments) are mpviz/trace/session.py's.
"""
import atexit
import json
import os
import subprocess
import sys
import threading
import time
import weakref

from .. import _tempdirs
from .. import trace as mtrace
from ..trace import autostart, recorder, session, watchdog
from ..trace.watchdog import parse_stacks   # one parser, shared with `mpviz trace`'s watchdog
from . import module as _scenario_module
from ._common import load_details
from .base import Result

DEFAULT_STALL_SECONDS = 4.0
DEFAULT_TIME_LIMIT = 25.0
POLL_SECONDS = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")

_active = weakref.WeakSet()     # runs still going (stopped when this process exits)


class Running:
    """One scenario run in progress. ``start()`` returns it; it never blocks.

    ``trace_dir``: the directory being recorded (``mpviz.trace.load(trace_dir)`` reads it live);
    ``trace()``: the events so far, as a live ``Trace``; ``done()``; ``result(timeout=None)``;
    ``stop()``: kill the run and clean up (the result then says it was stopped);
    ``progress()``: (seconds so far, events so far) for a progress line.
    """

    def __init__(self, name, params, trace_dir=None):
        self.name, self.params = name, dict(params)
        self._case = _scenario_module(name)
        self.stall_seconds = float(getattr(self._case, "STALL_SECONDS", DEFAULT_STALL_SECONDS))
        self.time_limit = float(getattr(self._case, "TIME_LIMIT", DEFAULT_TIME_LIMIT))
        if trace_dir is None:
            self.trace_dir = _tempdirs.make(f"mpviz-{name}-")    # removed at exit
        else:
            self.trace_dir = os.path.abspath(os.fspath(trace_dir))
            os.makedirs(self.trace_dir, exist_ok=True)
            if any(f.endswith(recorder.SUFFIX) for f in os.listdir(self.trace_dir)):
                raise ValueError(f"trace_dir {self.trace_dir!r} already holds a recording; "
                                 f"give an empty or new directory")
        self.stacks_dir = os.path.join(self.trace_dir, ".stacks")
        os.makedirs(self.stacks_dir, exist_ok=True)
        self._lock = threading.Lock()
        self._live = None
        self._result = None
        self._finished = threading.Event()
        self._wake = threading.Event()
        self._stop_requested = False
        self._events = 0
        self.started = time.monotonic()
        with open(os.path.join(self.trace_dir, "output.txt"), "wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "mpviz.scenarios._driver", name, json.dumps(self.params),
                 self.trace_dir],
                env=self._environment(), cwd=self.trace_dir, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        self.pid = self._proc.pid
        _active.add(self)
        self._thread = threading.Thread(target=self._watch, name=f"mpviz-watchdog-{name}",
                                        daemon=True)
        self._thread.start()

    def __repr__(self):
        state = self._result.outcome if self._result else "running"
        return f"<Running {self.name} {self.params} ({state}) in {self.trace_dir}>"

    def _environment(self):
        env = dict(os.environ)
        for key in (autostart.ENV_DIR, autostart.ENV_THREADING_LOCKS, "MPVIZ_SHARING_STRATEGY",
                    "MPVIZ_SHM_MANAGER"):
            env.pop(key, None)       # the case decides these, not the caller's environment
        env["PYTHONPATH"] = os.pathsep.join(
            [SITE, ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["MPVIZ_SCENARIO_STACKS"] = self.stacks_dir
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        return env

    # --- what callers use ----------------------------------------------------------------------

    def trace(self):
        """The events recorded so far (a live ``mpviz.trace.Trace``; complete once done)."""
        if self._result is not None:
            return self._result.trace
        with self._lock:
            if self._live is None:
                self._live = mtrace.Trace(self.trace_dir)
            try:
                self._live.refresh()
            except FileNotFoundError:
                pass
            return self._live

    def done(self):
        return self._finished.is_set()

    def progress(self):
        """(seconds since start, events recorded so far)."""
        end = self._result.duration_s if self._result else time.monotonic() - self.started
        return end, self._events

    def result(self, timeout=None):
        """Wait for the verdict (at most `timeout` seconds: TimeoutError after that)."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"scenario {self.name!r} has not finished within {timeout} s "
                               f"(it is still running; stop() ends it)")
        return self._result

    def stop(self):
        """Kill the run now, clean up, and return its (stopped) result."""
        self._stop_requested = True
        self._wake.set()
        return self.result()

    # --- the watchdog ----------------------------------------------------------------------------

    def _watch(self):
        try:
            live = mtrace.Trace(self.trace_dir)       # (the events so far, for progress())
            # the hang watchdog of `mpviz trace`: stuck is judged by what each thread waits
            # on, not by silence (a case that sleeps is not stuck)
            eyes = watchdog.Watchdog(self.trace_dir, self.stall_seconds,
                                     watchdog.SessionPids(self.pid))
            reason = None
            while True:
                finished = self._proc.poll() is not None
                try:
                    live.refresh()
                except Exception:
                    pass
                self._events = len(live)
                if finished:
                    break
                if self._stop_requested:
                    reason = "stopped"
                    break
                if eyes.poll() and eyes.kind == "deadlock":
                    reason = "stuck"       # (stalled -- a sleep longer than STALL_SECONDS --
                    break                  # is no hang of a case: it goes on, to TIME_LIMIT)
                if time.monotonic() - self.started > self.time_limit:
                    reason = "time limit"
                    break
                self._wake.wait(POLL_SECONDS)
            self._result = self._finish(reason, live, eyes)
        except BaseException as exc:      # never leave a caller waiting forever
            import traceback
            session.kill_session(self.pid, self._proc, graceful=False)
            self._result = Result(self.name, self.params, mtrace.Trace(None), "error",
                                  f"mpviz failed while watching this run: {exc!r}",
                                  time.monotonic() - self.started,
                                  problem=traceback.format_exc())
        finally:
            _active.discard(self)
            self._finished.set()

    def _finish(self, reason, live, eyes):
        stacks = {}
        if reason == "stuck":
            stacks = eyes.capture_stacks()
        elif reason == "time limit":
            stacks = self._capture_stacks(live)
        kill_ns = time.monotonic_ns()
        killed = session.kill_session(self.pid, self._proc, graceful=reason is None)
        duration = time.monotonic() - self.started
        stalled_for = eyes.stalled_for
        if reason == "stuck":        # per process: "deadlock", "stalled" or "stopped"
            eyes.record_verdict(stacks, killed, kill_ns)
        elif reason is not None:
            watchdog.record_stuck(self.trace_dir, stacks, lambda pid: reason, stalled_for,
                                  killed, why=reason)
        trace = mtrace.load(self.trace_dir)
        details = load_details(os.path.join(self.trace_dir, "details.json"))
        removed = session.remove_segments(trace, wait=0.0 if reason else 1.0)
        details["cleanup"] = {"killed": killed, "unlinked": removed}
        output = session.read_text(os.path.join(self.trace_dir, "output.txt"))
        stopped = reason == "stopped"
        problem = None
        if reason == "stuck":
            details["stuck"] = {"seconds_without_progress": round(stalled_for, 2),
                                "stacks": {str(k): v["stacks"] for k, v in stacks.items()}}
        if stopped:
            outcome = "error"
            explanation = (f"Stopped after {duration:.1f} s, before the case finished. Nothing "
                           f"is left: {len(killed)} process(es) killed, {len(removed)} shared-"
                           f"memory segment(s) removed. Run it again to see the verdict.")
        elif reason == "time limit":
            outcome, problem = "error", (
                f"the run did not finish within its time limit of {self.time_limit:.0f} s (it "
                f"was not stuck: its threads kept moving, or waited with a deadline)")
            explanation = (f"mpviz could not finish this case: {problem}. Where each process "
                           f"was:\n{_stack_summary(stacks)}")
        elif "driver_error" in details or (reason is None and not details.get("finished")):
            outcome = "error"
            problem = details.get("driver_error") or (
                f"the driver exited with status {self._proc.returncode} before finishing; "
                f"its output:\n{output[-2000:]}")
            explanation = f"mpviz itself failed to run this case:\n{problem}"
        else:
            try:
                outcome, explanation = self._case.verdict(trace, details)
            except Exception:
                import traceback
                outcome, problem = "error", traceback.format_exc()
                explanation = f"mpviz failed to judge this run:\n{problem}"
            if reason == "stuck":
                if outcome != "deadlock":
                    explanation = (f"The watchdog found the run stuck for good (every thread "
                                   f"of {'a process' if eyes.stuck_pids else 'the run'} waited "
                                   f"{stalled_for:.1f} s with no time limit, for what no "
                                   f"thread could still do), so it stopped it; the case did not "
                                   f"expect that. {explanation}")
                outcome = "deadlock"
                explanation += ("\n\nWhere the stuck processes were (captured with faulthandler "
                                "before they were killed):\n" + _stack_summary(stacks))
        return Result(self.name, self.params, trace, outcome, explanation, duration,
                      stacks={pid: v["stacks"] for pid, v in stacks.items()}, details=details,
                      output=output, problem=problem, stopped=stopped)

    def _capture_stacks(self, live):
        """Ask each recorded, still-running process of the run for its Python stacks."""
        names = {p.pid: p.name for p in live.processes()}
        names.setdefault(self.pid, "driver")
        pids = [pid for pid in session.session_pids(self.pid) if pid in names]
        return session.capture_stacks(pids, names, self.stacks_dir)



# --- small things -----------------------------------------------------------------------------------

def _stack_summary(stacks, frames=4):
    """Each stuck process's threads, innermost frames first, one line per thread."""
    if not stacks:
        return "  (no stacks: the processes had already exited)"
    lines = []
    for pid, info in stacks.items():
        lines.append(f"  pid {pid} ({info['name'] or '?'}):")
        for thread, calls in _parse_stacks(info["stacks"]):
            shown = " <- ".join(calls[:frames]) + (" <- ..." if len(calls) > frames else "")
            lines.append(f"    {thread}: {shown or '(no Python frames)'}")
    return "\n".join(lines)


def _parse_stacks(text):
    """faulthandler's text as [(thread label, ["fn (file.py:line)", ...innermost first])]."""
    return [(label, [call for call, _mine in calls]) for label, calls in parse_stacks(text)]


@atexit.register
def _at_exit():
    for running in list(_active):
        try:
            running.stop()
        except Exception:
            pass                # (their temporary folders go after this: see _tempdirs)
