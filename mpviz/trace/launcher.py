"""``python -m mpviz trace -o DIR -- python prog.py``: run an unmodified program, recorded.

    the launcher (this process)                      the program, in a session of its own
    ---------------------------                      -------------------------------------
    1. DIR writable? else refuse (exit 2): nothing   every Python process of it records into
       has run yet                                   DIR (autostart/: a sitecustomize put on
    2. start the program ─────────────────────────▶  PYTHONPATH), and shows its stacks on
    3. SIGTERM / SIGINT / SIGHUP to the launcher ──▶  SIGUSR1 (autostart.register_stacks)
       are passed on to the program
    4. wait; the hang watchdog (watchdog.py) looks
       at DIR and the session's CPU 10x a second:
       no progress for --hang-after S → stacks ───▶  SIGUSR1: stacks;  SIGKILL: the session
       + verdict, the session killed, exit 124
    5. always: DIR/trace.json; the pictures when they are worth their cost (below); where they
       went; the program's exit status (128+N if a signal N ended it)

Why a session of its own: every process the program starts inherits its session id, even one
whose parent died and was re-parented to init, so "the program's processes" is "the session's
processes" (the scenarios' runner finds its runs' processes the same way). A terminal's Ctrl-C
then reaches only the launcher, which passes it on to the program's process group -- as the
terminal would have.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from . import autostart, recorder

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TO_GROUP = (signal.SIGINT, signal.SIGHUP)   # a terminal sends these to the whole process group
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Refused(Exception):
    """Raised when the launcher refuses to start the program (bad -o, say); exit status 2."""


def say(message):
    print(f"mpviz trace: {message}", file=sys.stderr, flush=True)


# --- 1. the trace directory, checked before anything runs ----------------------------------

def prepare_directory(output):
    """(absolute path, created by us?) of a writable, empty-of-logs trace directory.

    Raises ``Refused`` with one line that says what, why and how to fix it."""
    if output is None:
        try:
            return os.path.abspath(tempfile.mkdtemp(prefix="mpviz-trace-", dir=".")), True
        except OSError as exc:
            raise Refused(f"cannot create a trace directory in {os.getcwd()!r} "
                          f"({exc.strerror}). Fix: give one you can write with -o DIR") from None
    path = os.path.abspath(output)
    created = not os.path.exists(path)
    try:
        if created:
            os.makedirs(path)
        elif not os.path.isdir(path):
            raise Refused(f"-o {output!r} is a file, not a directory. Fix: give a new or "
                          f"empty directory")
        elif any(f.endswith(recorder.SUFFIX) for f in os.listdir(path)):
            raise Refused(f"-o {output!r} already holds a recording; mixing two runs would "
                          f"draw a false picture. Fix: give a new or empty directory")
        with tempfile.TemporaryFile(dir=path):     # can we write there? (root ignores modes)
            pass
    except OSError as exc:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise Refused(f"cannot write the trace to {output!r} ({exc.strerror or exc}). Fix: "
                      f"give -o a directory you can write, e.g. -o ./trace") from None
    return path, created


def _environment(directory, threading_locks, stacks_dir):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [autostart.site_directory(), ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    env[autostart.ENV_DIR] = directory
    env[autostart.ENV_LAUNCHER] = str(os.getpid())
    env.pop(autostart.ENV_THREADING_LOCKS, None)
    env.pop(autostart.ENV_STACKS, None)
    if threading_locks:
        env[autostart.ENV_THREADING_LOCKS] = "1"
    if stacks_dir:
        env[autostart.ENV_STACKS] = stacks_dir
    return env


# --- 3. signals to the launcher go to the program ------------------------------------------

class Forwarder:
    """While installed, SIGTERM/SIGINT/SIGHUP to this process are sent on to the program.

    Installed before the program starts: a signal that arrives meanwhile is kept, and sent as
    soon as ``attach(child)`` names the program."""

    def __init__(self):
        self.child, self.received, self.pending, self._old = None, [], [], {}
        for sig in FORWARDED:
            self._old[sig] = signal.signal(sig, self._forward)

    def attach(self, child):
        self.child = child
        for signum in self.pending:
            self._send(signum)

    def _forward(self, signum, frame):
        self.received.append(signal.Signals(signum).name)
        if self.child is None:
            self.pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum):
        try:
            if signum in TO_GROUP:
                os.killpg(self.child.pid, signum)   # the program leads its process group
            else:
                os.kill(self.child.pid, signum)
        except OSError:
            pass                                    # it has just ended

    def remove(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# --- the whole run -------------------------------------------------------------------------

def run(program, output=None, hang_after=10.0, plot=None, threading_locks=False):
    """Run `program` (argv list) recorded; return the exit status (see the module's text).

    `plot`: True draws, False never draws, None draws when worth it. Raises ``Refused``.

    Pictures cost more than many programs take (importing matplotlib; the figure:
    docs/PERFORMANCE.md). They are drawn when asked (``--plot``) or when the run ended in a way
    worth looking at: a hang verdict, a signal, a non-zero exit status. ``--no-plot`` never draws;
    ``mpviz.trace.load(DIR).plot()`` draws later."""
    from .watchdog import HANG_EXIT_STATUS, STACKS, Watchdog, check_hang_after
    try:
        hang_after = check_hang_after(hang_after, "--hang-after")
    except ValueError as exc:
        raise Refused(str(exc)) from None
    directory, created = prepare_directory(output)
    stacks_dir = os.path.join(directory, STACKS) if hang_after else None
    if stacks_dir:
        os.makedirs(stacks_dir, exist_ok=True)
    # The launcher records too (as the program's parent): the trace shows how the program ended
    # even if it was killed.
    recording = recorder.start(directory, "launcher")
    forwarder = Forwarder()
    try:
        child = subprocess.Popen(program, env=_environment(directory, threading_locks,
                                                           stacks_dir),
                                 start_new_session=True)
    except OSError as exc:
        forwarder.remove()
        recorder.stop()
        _remove_what_we_made(directory, created)
        say(f"cannot run {program[0]!r}: {exc.strerror or exc}. Fix: check the command after "
            f"-- (nothing was recorded)")
        return 126 if isinstance(exc, PermissionError) else 127
    if recording:
        recorder.emit("process.launch", child=child.pid, name=" ".join(program),
                      start_method="exec")
    forwarder.attach(child)
    _say_how_to_finish(directory)
    watchdog, verdict = None, None
    try:
        if hang_after:
            from ..scenarios.runner import _session_pids
            watchdog = Watchdog(directory, hang_after, lambda: _session_pids(child.pid))
        code = _wait(child, watchdog)
        if code is None:                          # hung: stacks, then end the whole session
            verdict = _stop_hung(child, watchdog)
            code = HANG_EXIT_STATUS
        else:
            _wait_for_the_rest(child)
    finally:
        forwarder.remove()
    if recording:
        returncode = child.returncode
        sig = signal.Signals(-returncode).name if returncode < 0 else None
        recorder.emit("process.reaped", child=child.pid, exitcode=returncode, signal=sig)
        # The launcher's own end, with the status it exits with (the program's): without it
        # its lane would be drawn "still running when the trace ends". What it does after
        # this (trace.json, the pictures) is not recorded.
        recorder.emit("process.exit", exitcode=code, how="launcher")
        recorder.stop()
    _report(directory, child, code, watchdog, verdict, forwarder.received, plot)
    _tidy(directory)
    return code


def _wait(child, watchdog):
    """The program's exit status (shell style), or None when the watchdog found it stuck."""
    while True:
        try:
            returncode = child.wait(timeout=0.1 if watchdog else None)
            return returncode if returncode >= 0 else 128 - returncode
        except subprocess.TimeoutExpired:
            pass
        if watchdog.poll():
            return None


def _wait_for_the_rest(child, seconds=1.0):
    """The program has exited; give the processes it left (a resource tracker, a fork server)
    a moment to exit too, so that their last events are in the trace. Any still running after
    that are left alone, as they would be without mpviz, and named."""
    import time
    from ..scenarios.runner import _session_pids
    deadline = time.monotonic() + seconds
    left = _session_pids(child.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)        # polling /proc: there is nothing to wait on for a non-child
        left = _session_pids(child.pid)
    if left:
        say(f"{len(left)} process(es) the program started still run after it exited (pids "
            f"{', '.join(map(str, left[:10]))}); what they do from now on is not in trace.json")


def _stop_hung(child, watchdog):
    from ..scenarios.runner import _kill_session, _remove_segments
    stacks = watchdog.capture_stacks()
    killed = _kill_session(child.pid, child, graceful=False)
    watchdog.record_verdict(stacks, killed)
    watchdog.trace.refresh(final=True)
    _remove_segments(watchdog.trace, wait=0.0)
    return watchdog.verdict(stacks, killed)


def _report(directory, child, code, watchdog, verdict, received, plot):
    """trace.json, the verdict, the pictures, and where they are. Never raises: whatever fails
    here is one line, and the program's exit status is kept."""
    from .trace import VERDICT_FILE, load
    try:
        if watchdog is not None:
            trace = watchdog.trace
            if verdict is None:
                trace.refresh(final=True)
            else:                            # (read to the end once already: the rest)
                trace.refresh()
        else:
            trace = load(directory)
        chrome = os.path.join(directory, "trace.json")
        trace.to_chrome(chrome)
    except (Exception, KeyboardInterrupt) as exc:    # (a Ctrl-C now stops only this)
        say(f"could not write {directory}/trace.json ({exc!r}); the raw logs are in "
            f"{directory} (mpviz.trace.load() reads them)")
        return
    if verdict:
        print(verdict, file=sys.stderr, flush=True)
        trace.verdict = verdict
        try:                                   # kept with the trace: load(directory).verdict
            with open(os.path.join(directory, VERDICT_FILE), "w") as f:
                f.write(verdict)
        except OSError as exc:
            say(f"could not keep the verdict in {directory} ({exc})")
    elif received:
        say(f"passed {', '.join(received)} on to the program, which ended with status {code}")
    program = [p for p in trace.processes() if p.how not in ("launcher", "watchdog")]
    say(f"{len(trace.events)} events from {len(program)} processes in {directory}")
    say(f"Chrome/Perfetto JSON: {chrome} (open it at https://ui.perfetto.dev)")
    for problem in trace.problems:
        say(f"could not read: {problem}")
    _say_notes(trace)
    _say_unended(trace, program)
    worth = verdict is not None or code != 0
    if plot is False or (plot is None and not worth):
        say(f"no pictures drawn{' (--no-plot)' if plot is False else ''}: "
            f"python -m mpviz trace --plot ... draws them, or mpviz.trace.load({directory!r})"
            f".plot() afterwards")
        return
    for name, path in _draw(trace, directory, hang=verdict is not None):
        say(f"{name}: {path}")


def _say_unended(trace, program):
    """Name the processes whose end was not recorded: one line each for a few, one line for
    many (a program that forked a thousand children must not get a thousand lines)."""
    killed = {pid for e in trace.of_kind("watchdog.kill") for pid in e.args.get("pids", ())}
    unended = [p for p in program if p.exitcode is None and p.signal is None and
               p.exit_ns is None and p.how != "exec" and p.pid not in killed]
    why = ("how it ended was not recorded (os._exit, or killed, and no recorded parent waited "
           "for it); its events up to then are all there")
    if len(unended) <= 5:
        for p in unended:
            say(f"pid {p.pid} ({p.name}): {why}")
        return
    from .trace import _pids_in_words
    say(f"{_pids_in_words([p.pid for p in unended])}: {why.replace('it ended', 'each ended')}")


def _say_notes(trace):
    """What could not be recorded (``Trace.notes``: a log the program took away, a torch version
    mpviz cannot see inside), again at the end, where the learner reads the report."""
    for line in trace.notes:
        say(f"NOT RECORDED: {line}")


def _draw(trace, directory, hang):
    """Save the timeline (and, after a hang, the wait-for graph); yield (what, path)."""
    try:
        from mpviz import viz
    except ImportError as exc:
        say(f"no pictures: mpviz.viz cannot be imported here ({exc}); the trace above is "
            f"complete. Fix: run with the Python that has matplotlib (the project's .venv)")
        return
    drawings = [("timeline picture", "timeline.png", viz.timeline)]
    if hang:
        drawings.append(("wait-for graph", "wait_for.png", viz.wait_for))
    notes = trace.notes                       # (reads notes.txt and every event: once)
    for what, name, draw in drawings:
        path = os.path.join(directory, name)
        try:
            _save_with_notes(draw(trace), notes, path)
        except KeyboardInterrupt:
            say("drawing interrupted; the trace is complete")
            return
        except Exception as exc:
            say(f"could not draw the {what} ({exc!r}); the trace is complete")
            continue
        yield what, path


# --- a launcher that was killed: finishing its trace afterwards ------------------------------

def _say_how_to_finish(directory):
    """Said at the start, because a launcher killed by SIGKILL can say nothing at its end."""
    say(f"recording into {directory} (if this launcher is killed, the program goes on; "
        f"python -m mpviz trace --finish {directory} then writes the trace from its logs)")


def finish(directory, plot=None):
    """``python -m mpviz trace --finish DIR``: what a killed launcher did not do -- trace.json,
    the pictures (when asked), the report -- from the logs in DIR. Returns 0; raises
    ``Refused`` when DIR holds no recording.

    A launcher killed by SIGKILL does none of steps 3-5 of the module's picture. Its program
    goes on (it does not depend on the launcher, and ending it would change what it does), says
    at its exit that the launcher is gone, and ``python -m mpviz trace --finish DIR`` -- said at
    the start, when it still can be -- writes trace.json from the logs afterwards (this)."""
    path = os.path.abspath(directory)
    if not os.path.isdir(path) or not any(f.endswith(recorder.SUFFIX) for f in os.listdir(path)):
        raise Refused(f"--finish {directory!r}: no recording there (no *{recorder.SUFFIX} "
                      f"logs). Fix: give the directory that `mpviz trace -o DIR` recorded into")
    from .trace import load
    _note_a_killed_launcher(path, load(path))
    _report(path, None, 0, None, None, [], plot)
    _tidy(path)
    return 0


def _note_a_killed_launcher(directory, trace):
    """A launcher's log with a program launched and never reaped: the launcher was killed
    before the program ended. Kept as a note (once), so the trace says why its end is missing."""
    reaped = {e.pid for e in trace.of_kind("process.reaped")}
    launchers = {e.pid for e in trace.of_kind("process.start") if e.args.get("how") == "launcher"}
    known = trace.notes                    # (a --finish run before this one may have noted it)
    for launch in trace.of_kind("process.launch"):
        if launch.pid in reaped or launch.pid not in launchers:
            continue
        line = (f"the launcher (pid {launch.pid}) was killed before the program (pid "
                f"{launch.args['child']}) ended: how the program ended, and what it did "
                f"after its log's last event, may be missing")
        if line not in known:
            recorder.note(directory, line)


def _save_with_notes(fig, notes, path):
    """Save `fig`; under it, in red, what could not be recorded (a picture is believed: one that
    is missing something says so on itself, not only on the terminal)."""
    if not notes:
        fig.savefig(path)
        return
    import textwrap
    lines = [textwrap.shorten(f"NOT RECORDED: {n}", 220) for n in notes[:5]]
    if len(notes) > 5:
        lines.append(f"... and {len(notes) - 5} more (mpviz.trace.load(DIR).notes)")
    fig.text(0.01, 0.0, "\n".join(lines), color="#b00000", fontsize=8, va="top", ha="left")
    fig.savefig(path, bbox_inches="tight")


def _remove_what_we_made(directory, created):
    """After a failed start: the directory if we made it, else only our own files in it."""
    if created:
        shutil.rmtree(directory, ignore_errors=True)
        return
    from .watchdog import STACKS
    shutil.rmtree(os.path.join(directory, STACKS), ignore_errors=True)
    for f in os.listdir(directory):
        if f.endswith(recorder.SUFFIX):
            os.unlink(os.path.join(directory, f))


def _tidy(directory):
    """Remove the stacks folder's empty files (every process made one, in case it hung)."""
    from .watchdog import STACKS
    folder = os.path.join(directory, STACKS)
    try:
        for f in os.listdir(folder):
            path = os.path.join(folder, f)
            if os.path.getsize(path) == 0:
                os.unlink(path)
        os.rmdir(folder)
    except OSError:
        pass                               # not empty: the stacks stay, next to the trace
