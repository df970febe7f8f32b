"""``python -m mpviz trace -o DIR -- python prog.py``: run an unmodified program, recorded.

    the launcher (this process)                      the program, in a session of its own
    ---------------------------                      -------------------------------------
    1. DIR writable? else refuse (exit 2): nothing   every Python process of it records into
       has run yet                                   DIR (autostart/: a sitecustomize put on
    2. start the program ─────────────────────────▶  PYTHONPATH), and shows its stacks on
    3. SIGTERM / SIGINT / SIGHUP to the launcher ──▶  SIGUSR1 (autostart.register_stacks)
       are passed on to the program; a first
       SIGINT (Ctrl-C) only after the report a hang
       gets: where everyone is (Forwarder)
    4. wait; the hang watchdog (watchdog.py) looks
       at the session's threads 10x a second (and
       at DIR when none moved; ReadAside reads DIR
       every 0.5 s, for a short read at the end):
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
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import warnings

from . import autostart, chrome, recorder, session

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TO_GROUP = (signal.SIGINT, signal.SIGHUP)   # a terminal sends these to the whole process group
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Refused(Exception):
    """Raised when the launcher refuses to start the program (bad -o, say); exit status 2."""


def say(message):
    print(f"mpviz trace: {message}", file=sys.stderr, flush=True)


# --- 1. the trace directory, checked before anything runs ----------------------------------

# What mpviz writes beside the logs, by these names: a directory that already holds one of them
# is refused (mpviz never overwrites a file it did not write in this run).
OUTPUTS = ("trace.json", "timeline.png", "wait_for.png", "verdict.txt", "lost_work.txt",
           recorder.NOTES, ".stacks")      # (trace.VERDICT_FILE, LOST_WORK_FILE, watchdog.STACKS)


def prepare_directory(output):
    """(absolute path, created by us?) of a writable, empty-of-logs trace directory.

    A new directory is made private (0700). An existing one must be yours and not writable by
    every user (else another user could plant a link or a log in it), and must not hold a
    recording or a file by one of the names mpviz writes (``OUTPUTS``). A symbolic link is
    followed only if you made it and it leads somewhere. Raises ``Refused`` with one line that
    says what, why and how to fix it."""
    if output is None:
        try:
            return os.path.abspath(tempfile.mkdtemp(prefix="mpviz-trace-", dir=".")), True
        except OSError as exc:
            raise Refused(f"cannot create a trace directory in {os.getcwd()!r} "
                          f"({exc.strerror}). Fix: give one you can write with -o DIR") from None
    path = os.path.abspath(output)
    _check_link(output, path)
    created = not os.path.lexists(path)
    try:
        if created:
            os.makedirs(path, mode=0o700)
        else:
            _check_existing(output, path)
        with tempfile.TemporaryFile(dir=path):     # can we write there? (root ignores modes)
            pass
    except OSError as exc:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        raise Refused(f"cannot write the trace to {output!r} ({exc.strerror or exc}). Fix: "
                      f"give -o a directory you can write, e.g. -o ./trace") from None
    return path, created


def _check_link(output, path):
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISLNK(st.st_mode):
        return
    target = os.path.join(os.path.dirname(path), os.readlink(path))
    if st.st_uid != os.getuid():
        raise Refused(f"-o {output!r} is a symbolic link made by uid {st.st_uid}, not by you: "
                      f"following it would write the trace where another user chose. Fix: "
                      f"give -o a new directory")
    if not os.path.exists(path):
        raise Refused(f"-o {output!r} is a symbolic link to {target!r}, which does not exist. "
                      f"Fix: create it first (mkdir -p {target}), or give -o a new directory")


def _check_existing(output, path):
    if not os.path.isdir(path):
        raise Refused(f"-o {output!r} is a file, not a directory. Fix: give a new or "
                      f"empty directory")
    _check_owner("-o", output, path)
    entries = os.listdir(path)
    if any(f.endswith(recorder.SUFFIX) for f in entries):
        raise Refused(f"-o {output!r} already holds a recording; mixing two runs would "
                      f"draw a false picture. Fix: give a new or empty directory")
    taken = [name for name in OUTPUTS if name in entries]
    if taken:
        raise Refused(f"-o {output!r} already holds {', '.join(taken)}: mpviz writes files by "
                      f"those names and never overwrites one it did not write. Fix: give a new "
                      f"or empty directory, or move {'them' if len(taken) > 1 else 'it'} away")


def _check_owner(option, output, path):
    """Refuse a trace directory that is another user's, or that every user can write: its
    owner (or anyone) could plant links or logs in it, and mpviz would read and write there."""
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise Refused(f"{option} {output!r} belongs to uid {st.st_uid}, not to you: its owner "
                      f"could plant links or logs in it. Fix: give a directory of your own "
                      f"(with -o, a new one: mpviz makes it, private to you)")
    if st.st_mode & 0o002:
        raise Refused(f"{option} {output!r} is writable by every user (mode "
                      f"{stat.S_IMODE(st.st_mode):o}): anyone could plant links or logs in it. "
                      f"Fix: give a new directory inside it, e.g. "
                      f"-o {os.path.join(output, 'trace')}")


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
    soon as ``attach(child)`` names the program.

    Ctrl-C is a diagnosis: the first SIGINT is held (``interrupted``) until the wait loop has
    reported where everyone is (``_report_interrupt``) and calls ``pass_on_interrupt()`` -- the
    program would start unwinding at once, and the report must show where it waited, not its
    exception handling. Another SIGINT meanwhile is passed on at once (you insist)."""

    def __init__(self):
        self.child, self.received, self.pending, self._old = None, [], [], {}
        self.interrupted, self._held = False, False
        for sig in FORWARDED:
            self._old[sig] = signal.signal(sig, self._forward)

    def pass_on_interrupt(self):
        """Send the held SIGINT on (after the report)."""
        if self._held:
            self._held = False
            self._send(signal.SIGINT)

    def attach(self, child):
        self.child = child
        for signum in self.pending:
            self._send(signum)

    def _forward(self, signum, frame):
        self.received.append(signal.Signals(signum).name)
        if signum == signal.SIGINT and not self.interrupted and self.child is not None:
            self.interrupted = self._held = True     # the wait loop reports, then sends it
            return
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
    from .watchdog import HANG_EXIT_STATUS, STACKS, ReadAside, Watchdog, check_hang_after
    try:
        hang_after = check_hang_after(hang_after, "--hang-after")
    except ValueError as exc:
        raise Refused(str(exc)) from None
    directory, created = prepare_directory(output)
    stacks_dir = os.path.join(directory, STACKS)     # (for the watchdog, and for a Ctrl-C)
    os.makedirs(stacks_dir, mode=0o700, exist_ok=True)
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
        from .watchdog import SessionPids
        eyes = Watchdog(directory, hang_after, SessionPids(child.pid))
        watchdog = eyes if hang_after else None
        eyes.aside = ReadAside(eyes.trace)
        try:
            code = _wait(child, watchdog, forwarder, eyes)
        finally:
            eyes.aside.stop()
        if code is None:                          # hung: stacks, then end the whole session
            verdict = _stop_hung(child, watchdog)
            if verdict is None:                   # (it ended by itself while judged: ended)
                code = _shell_status(child.returncode)
            else:
                code = HANG_EXIT_STATUS
        if verdict is None:
            _wait_for_the_rest(child, stop=forwarder.interrupted, trace=eyes.trace,
                               directory=directory)
            eyes.trace.refresh()              # how its children ended that nobody waited for
            eyes.note_ended_unwaited()        # (a crash the fork server reaped, say)
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
    _note_a_silent_program(directory, child, program)
    from .trace import without_gc
    with without_gc():
        # The cyclic collector off until the trace is let go: turned back on with the whole
        # trace alive it walked every event and trace.json's every dict once more (0.5 s of
        # CPU for a 290,000-event DataLoader trace), looking for cycles they are not in.
        _report(directory, child, code, watchdog, verdict, forwarder.received, plot)
        eyes = watchdog = None
    _tidy(directory)
    return code


def _note_a_silent_program(directory, child, program):
    """No process of the program wrote a log: mpviz never started inside it. Say so, with why
    (Python's -I/-S/-E switch off what loads mpviz), as a note: never "4 events from 1 process"
    read as a program that did nothing."""
    if _program_recorded(directory):
        return
    from .trace import UNKNOWN
    command = " ".join(program)
    switches = _python_switches(program)
    blocking = sorted(switches & {"I", "S", "E"})
    if blocking:
        why = {"I": "python -I (isolated mode) ignores PYTHONPATH and skips site",
               "S": "python -S skips site, which loads sitecustomize",
               "E": "python -E ignores PYTHONPATH"}[blocking[0]]
        flags = " ".join(f"-{f}" for f in blocking)
        line = (f"the program (pid {child.pid}: {command}) recorded nothing: {why}, so mpviz's "
                f"autostart (a sitecustomize on PYTHONPATH) never ran in it. Its processes, "
                f"messages and shared memory are {UNKNOWN}. Fix: run it without {flags} "
                f"({' '.join(_without(program, blocking))}), or record from inside the "
                f"program: with mpviz.trace.record('DIR'): main()")
    else:
        line = (f"the program (pid {child.pid}: {command}) recorded nothing: mpviz's autostart "
                f"(a sitecustomize on PYTHONPATH) did not run in it (not a Python program, a "
                f"Python without site, or one that replaced PYTHONPATH?). Its processes, "
                f"messages and shared memory are {UNKNOWN}. Fix: run the script with "
                f"python directly (mpviz trace -- python prog.py), or record from inside it: "
                f"with mpviz.trace.record('DIR'): main()")
    recorder.note(directory, line)


def _without(program, letters):
    """`program` with Python's one-letter switches `letters` taken out (-IS -> -S, -I -> )."""
    out, switches = [program[0]], True
    for arg in program[1:]:
        if switches and arg.startswith("-") and not arg.startswith("--") and len(arg) > 1:
            if arg[1] in "cm":
                switches = False
            else:
                arg = "-" + "".join(c for c in arg[1:] if c not in letters)
                if arg == "-":
                    continue
        else:
            switches = False
        out.append(arg)
    return out


def _program_recorded(directory):
    """Did any process of the program write a log? (The recorder names a log "<pid>-<n>"; the
    launcher's own, and its watchdog's, carry the launcher's pid. A program that is not Python
    itself -- bash -c "python prog.py" -- records through its Python children.)"""
    mine = f"{os.getpid()}-"
    return any(f.endswith(recorder.SUFFIX) and not f.startswith(mine)
               for f in os.listdir(directory))


def _python_switches(program):
    """The one-letter switches given to Python before its script (``-IS`` -> {"I", "S"})."""
    if not program or not os.path.basename(program[0]).startswith("python"):
        return set()
    letters, args = set(), iter(program[1:])
    for arg in args:
        if not arg.startswith("-") or arg.startswith("--") or arg == "-":
            break                         # the script (or --version ...): no more switches
        for i, letter in enumerate(arg[1:]):
            if letter in "cmWX":          # -c CMD / -m MOD end the switches; -W/-X take a value
                if letter in "cm":
                    return letters
                if i == len(arg) - 2:
                    next(args, None)
                break
            letters.add(letter)
    return letters


def _wait(child, watchdog, forwarder, eyes):
    """The program's exit status (shell style), or None when the watchdog found it stuck.
    A Ctrl-C meanwhile: the report (``_report_interrupt``), then the SIGINT passed on."""
    while True:
        try:
            with eyes.aside.while_waiting():   # (the logs are read meanwhile: ReadAside)
                returncode = child.wait(timeout=0.1)
            return _shell_status(returncode)
        except subprocess.TimeoutExpired:
            pass
        if forwarder.interrupted and forwarder._held:
            _report_interrupt(eyes)
            forwarder.pass_on_interrupt()
        elif watchdog is not None:
            try:
                if watchdog.poll():
                    return None
            except Exception:           # a bug of mpviz's: never an orphaned, unwatched program
                _say_watchdog_failed()
                watchdog = None         # (the program goes on; Ctrl-C still reports and stops)


def _say_watchdog_failed():
    """The hang watchdog raised (a bug in mpviz, not in the program): say so with its
    traceback, and go on waiting for the program without it. Leaving instead would orphan the
    program -- a hung one would run on, unwatched, for ever."""
    import traceback
    say("the hang watchdog failed -- a bug in mpviz, not in your program (please report it, "
        "with the lines below); it is off for the rest of this run: the program goes on, and "
        "Ctrl-C still stops it and says where each process is.\n" +
        "".join(traceback.format_exc(limit=-4)).rstrip())


def _report_interrupt(eyes):
    """Ctrl-C is a diagnosis: where each process is, what each waits for, who must act -- the
    hang verdict's report, said before the program hears the SIGINT and starts unwinding; kept
    in the trace directory as the verdict (``load(DIR).verdict``)."""
    import time
    from .trace import VERDICT_FILE
    from . import stuck
    from .watchdog import interrupt_report
    began = time.monotonic()
    try:
        eyes.trace.refresh()                      # (every process started so far is named)
        eyes.look_now()                           # each thread: working, or waiting on what
        stacks = eyes.capture_stacks()
        eyes.trace.refresh()
        report = interrupt_report(eyes.trace, stacks,
                                  threads=stuck.threads_in_words(eyes, stacks, chains=False))
    except Exception as exc:                      # the SIGINT goes on whatever happens here
        report = f"mpviz trace: INTERRUPTED (Ctrl-C); no report ({exc!r})"
    print(report, file=sys.stderr, flush=True)
    say(f"(that took {time.monotonic() - began:.1f} s) passing SIGINT on to the program, as "
        f"the terminal would; Ctrl-C again passes another one on")
    try:
        _write_private(eyes.directory, VERDICT_FILE, lambda f: f.write(report.encode()))
    except OSError:
        pass


def _wait_for_the_rest(child, seconds=1.0, stop=False, trace=None, directory=None):
    """The program has exited; give the processes it left (a resource tracker, a fork server)
    a moment to exit too, so that their last events are in the trace. Any still running after
    that are left alone, as they would be without mpviz, and named -- unless you pressed
    Ctrl-C (`stop`): you asked for the program to stop, so they are killed, and the shared
    memory its processes left is removed."""
    import time
    deadline = time.monotonic() + seconds
    left = session.session_pids(child.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)        # polling /proc: there is nothing to wait on for a non-child
        left = session.session_pids(child.pid)
    if left and stop:
        killed = _kill(child, directory)
        say(f"after the Ctrl-C, stopped {len(killed[0])} process(es) the program left running "
            f"(pids {', '.join(map(str, killed[0][:10]))}) with SIGKILL{killed[1]}")
    elif left:
        say(f"{len(left)} process(es) the program started still run after it exited (pids "
            f"{', '.join(map(str, left[:10]))}); what they do from now on is not in trace.json")
    if stop and trace is not None:
        trace.refresh()
        removed = session.remove_segments(trace, wait=0.5)
        if removed:
            say(f"after the Ctrl-C, removed {len(removed)} shared-memory segment(s) the "
                f"program left in /dev/shm")


def _shell_status(returncode):
    """A Popen returncode as a shell says it: -9 (killed by SIGKILL) is 137."""
    return returncode if returncode >= 0 else 128 - returncode


def _stop_hung(child, watchdog):
    """Stacks, the kill, the verdict -- or None when the program's main process ended by itself
    before the kill (a wait with a deadline, judged stalled, ran out while the stacks were
    taken: on a busy machine that takes seconds). Then there was no hang to report."""
    import time
    stacks = watchdog.capture_stacks()
    if child.poll() is not None and child.returncode >= 0:
        _say_ended_while_judged(child, watchdog)
        return None
    crashed = child.returncode          # (a signal during the capture: not an end by itself)
    kill_ns = time.monotonic_ns()
    killed, cleaned = _kill(child, watchdog.directory)
    if crashed is None and child.pid not in killed and child.returncode >= 0:
        _say_ended_while_judged(child, watchdog, killed)      # (in the moment before the kill)
        return None
    watchdog.record_verdict(stacks, killed, kill_ns)
    watchdog.trace.refresh(final=True)
    session.remove_segments(watchdog.trace, wait=0.0)
    try:
        verdict = watchdog.verdict(stacks, killed)
    except Exception:                     # (stopped and cleaned up already: say what is known)
        import traceback
        from .watchdog import stack_summary
        where = stack_summary(stacks, trace=watchdog.trace)
        verdict = (f"mpviz trace: HANG -- mpviz stopped {len(killed)} process(es) with SIGKILL, "
                   f"but failed to say why -- a bug in mpviz (please report it, with the lines "
                   f"below); where each process was:\n{where}\n" +
                   "".join(traceback.format_exc(limit=-4)).rstrip())
    if crashed is not None and crashed < 0:
        verdict += (f"\nmpviz trace: while mpviz took the stacks, the program's main process "
                    f"(pid {child.pid}) died of {signal.Signals(-crashed).name}"
                    + (": in the middle of writing its stacks (the file ends mid-line) -- "
                       "faulthandler, which writes them when mpviz asks (SIGUSR1), can crash a "
                       "process while another of its threads runs Python: a fault of mpviz's "
                       "report, not of your program; the verdict above stands on what was "
                       "recorded before it"
                       if _dump_cut_short(watchdog, child.pid) else ""))
    return verdict + (f"\nmpviz trace: after the kill{cleaned}" if cleaned else "")


def _dump_cut_short(watchdog, pid):
    """Did `pid` die while faulthandler wrote its stacks (its stacks file ends mid-line)?"""
    try:
        with open(os.path.join(watchdog.stacks_dir, f"{pid}.txt"), "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _say_ended_while_judged(child, watchdog, killed=()):
    """The program's main process exited (status >= 0) between the judgment and the kill."""
    from .watchdog import no_hang_words
    left = (f"; mpviz stopped the {len(killed)} process(es) it left (pids "
            f"{', '.join(map(str, killed[:10]))}) with SIGKILL" if killed else "")
    say(no_hang_words(watchdog, f"the program ended by itself (exit status {child.returncode}) "
                                f"while mpviz took its stacks", "--hang-after", left))


def _kill(child, directory):
    """SIGKILL to every process of the program's session: (the pids killed, what the program's
    resource trackers then removed, in words: ", Python's resource tracker removed the 2
    semaphores ..." or ""). Marked first, so that each tracker says its cleanup to us rather
    than as a leak of the program's (autostart.tracker_words)."""
    from .watchdog import STACKS
    folder = os.path.join(directory, STACKS) if directory else None
    try:
        os.close(os.open(os.path.join(folder, autostart.KILLED_MARK),
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except (OSError, TypeError):
        folder = None                       # (no folder: Python's own words, as without mpviz)
    killed = session.kill_session(child.pid, child, graceful=False)
    return killed, _tracker_cleanup(folder) if folder else ""


def _tracker_cleanup(folder):
    """What the trackers wrote in `folder` after the kill (autostart.tracker_words), in words;
    their notes are removed once read."""
    removed = {}
    for f in os.listdir(folder):
        if f.endswith(autostart.TRACKER_SUFFIX):
            for line in session.read_text(os.path.join(folder, f)).splitlines():
                count, _, kind = line.partition(" ")
                if count.isdigit():
                    removed[kind] = removed.get(kind, 0) + int(count)
            os.unlink(os.path.join(folder, f))
    if not removed:
        return ""
    names = {"semaphore": "semaphore(s) (under the program's locks and queues)",
             "shared_memory": "shared-memory segment(s)"}
    what = " and ".join(f"{n} {names.get(kind, kind + ' object(s)')}"
                        for kind, n in sorted(removed.items()))
    return (f", Python's resource tracker removed the {what} that the killed processes "
            f"held, as it does after any kill")


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
        chrome = _write_trace_json(directory, trace)
    except (Exception, KeyboardInterrupt) as exc:    # (a Ctrl-C now stops only this)
        say(f"could not write {directory}/trace.json ({exc!r}); the raw logs are in "
            f"{directory} (mpviz.trace.load() reads them)")
        return
    if verdict is None and code != 0:            # a failed torch.distributed program: why
        verdict = _distributed_failure(trace)
    if verdict:
        print(verdict, file=sys.stderr, flush=True)
        trace.verdict = verdict
        try:                                   # kept with the trace: load(directory).verdict
            _write_private(directory, VERDICT_FILE, lambda f: f.write(verdict.encode()))
        except OSError as exc:
            say(f"could not keep the verdict in {directory} ({exc})")
    elif received:
        say(f"passed {', '.join(received)} on to the program, which ended with status {code}")
    elif child is not None and child.returncode is not None and child.returncode < 0:
        say(_killed_words(child))
    program = [p for p in trace.processes() if p.how not in ("launcher", "watchdog")]
    if child is not None and not _program_recorded(directory):
        say(f"{len(trace.events)} events in {directory}, all of them mpviz's own: the program "
            f"recorded nothing (NOT RECORDED below says why)")
    else:
        n = len(program)
        say(f"{len(trace.events)} events from {n} process{'es' if n != 1 else ''} in {directory}")
    say(f"Chrome/Perfetto JSON: {chrome} (open it at https://ui.perfetto.dev)")
    for problem in trace.problems:
        say(f"could not read: {problem}")
    _say_notes(trace)
    _say_unended(trace, program)
    if verdict is None:
        _say_crashes(trace, program)
        _say_lost_work(trace, directory, code)
    worth = verdict is not None or code != 0
    if plot is False or (plot is None and not worth):
        say(f"no pictures drawn{' (--no-plot)' if plot is False else ''}: "
            f"python -m mpviz trace --plot ... draws them, or mpviz.trace.load({directory!r})"
            f".plot() afterwards")
        return
    for name, path in _draw(trace, directory, hang=verdict is not None):
        say(f"{name}: {path}")


def _write_trace_json(directory, trace):
    """DIR/trace.json (its path)."""
    return _write_private(directory, "trace.json",
                          lambda f: _trace_json_into(f, trace, directory))


# From this many events on, trace.json's two halves are made in two processes at once: the
# program has ended, and the launcher's tail is all it waits for (a 240,000-event DataLoader
# trace: 2.1 s in one process -- a third of what tracing added to its run -- 1.45 s in two).
TWO_HALVES_FROM = 50_000


def _trace_json_into(f, trace, directory):
    """trace.json into the binary file `f`: the bytes ``_json_into(f, trace.to_chrome())``
    writes. On a machine with two CPUs or more and a long trace, a forked child makes and
    encodes chrome.flow_part (the instants and messages) into an unlinked file of `directory`
    while this process makes and encodes chrome.state_part; a child that fails costs only the
    time: its half is made here again."""
    ready = chrome.Ready(trace)
    child = None
    if len(trace.events) >= TWO_HALVES_FROM and len(os.sched_getaffinity(0)) >= 2:
        _fast_dumps()                    # (built or loaded here, once: not by both processes)
        half = tempfile.TemporaryFile(dir=directory)         # (0600, and no name to find)
        try:
            child = _fork_quietly()
        except OSError:                  # (no process to spare: EAGAIN, a limit on them)
            half.close()
    if child is None:
        return _json_into(f, ready.as_dict(chrome.state_part(trace, ready) +
                                           chrome.flow_part(trace, ready)))
    with half:
        if child == 0:                                         # the child: flow_part only
            status = 1
            try:
                _events_into(half, chrome.flow_part(trace, ready))
                half.flush()
                status = 0
            finally:
                os._exit(status)
        try:
            f.write(b'{"traceEvents": [')
            wrote = _events_into(f, chrome.state_part(trace, ready))
            ended_well = _reap(child) == 0
        except BaseException:                                  # (Ctrl-C: the child goes too)
            _kill_and_reap(child)
            raise
        if ended_well:
            half.seek(0)
            if half.read(1):
                if wrote:
                    f.write(b", ")
                half.seek(0)
                shutil.copyfileobj(half, f, 1 << 20)
        else:
            flow = chrome.flow_part(trace, ready)
            if wrote and flow:
                f.write(b", ")
            _events_into(f, flow)
        f.write(b"]" + _after_events(ready.as_dict([])))


def _fork_quietly():
    """os.fork(), without Python 3.12's DeprecationWarning about a process with threads: the
    child only computes, writes one file and leaves with os._exit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _reap(pid):
    """The exit status of child `pid`, once it has ended (-N: killed by signal N)."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _kill_and_reap(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def _killed_words(child):
    """The program's end when a signal that mpviz did not pass on ended it (kill -9 from
    another terminal, the out-of-memory killer, a crash): a status of 128+N alone says little."""
    sig = signal.Signals(-child.returncode)
    why = {signal.SIGKILL: "kill -9 sends it, and so does the kernel's out-of-memory killer "
                           "(dmesg names what it killed); nothing in the program runs after it "
                           "(no finally, no atexit)",
           signal.SIGSEGV: "a crash in native code (a C extension, a library)",
           signal.SIGABRT: "abort(): a failed check in native code"}.get(sig, "")
    return (f"the program (pid {child.pid}) was killed by a signal, {sig.name} ({sig.value}), "
            f"which mpviz did not send: exit status {128 + sig.value}"
            + (f" ({why})" if why else "")
            + "; what it recorded until then is all in the trace")


def _distributed_failure(trace):
    """The verdict of a program that used torch.distributed and failed (dist_verdict.py), or
    None: which rank failed, in which collective, and who waited for it."""
    from . import dist_verdict
    try:
        judged = dist_verdict.judge(trace)
    except Exception as exc:                 # (the report goes on without it)
        say(f"could not judge the torch.distributed events ({exc!r})")
        return None
    return None if judged is None else "\n".join(judged.headline(0) + judged.lines)


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


def _say_crashes(trace, program):
    """Name the processes that crashed in native code (SIGSEGV, SIGABRT ...), with the line,
    where nothing else said it: a child's crash ends no program by itself, and a program that
    never joins it (or joins it and ignores p.exitcode) ends with status 0."""
    for p in program:
        if p.signal:
            from . import analysis
            if p.signal in analysis.CRASHES:
                say(f"pid {p.pid} ({p.name}) {analysis.how_it_ended(trace, p.pid)}")


def _say_lost_work(trace, directory, code):
    """What the run lost without a word (analysis.lost_work: dropped messages, task errors
    nobody asked for, a model forked without share_memory(), messages and queue.Queue items
    nobody got, daemons terminated mid-work), said and kept beside the logs:
    ``load(directory).lost_work``."""
    from .analysis import lost_work
    from .trace import LOST_WORK_FILE
    lines = trace.lost_work = lost_work(
        trace, "the program ended with status 0" if code == 0 else None)
    for line in lines:
        say(line)
    if lines:
        try:
            _write_private(directory, LOST_WORK_FILE,
                           lambda f: f.write("".join(f"{line}\n" for line in lines).encode()))
        except OSError as exc:
            say(f"could not keep these lines in {directory} ({exc})")


def _say_notes(trace):
    """What could not be recorded (``Trace.notes``: a log the program took away, a torch version
    mpviz cannot see inside), again at the end, where the learner reads the report."""
    for line in trace.notes:
        say(f"NOT RECORDED: {line}")


def _draw(trace, directory, hang):
    """Save the timeline (and, after a hang, the wait-for graph); yield (what, path)."""
    from .trace import drawing
    try:
        viz = drawing()                       # mpviz.viz, by name (trace.py: DRAWING)
    except ImportError as exc:
        say(f"no pictures: mpviz.viz cannot be imported here ({exc}); the trace above is "
            f"complete. Fix: run with the Python that has matplotlib (the project's .venv)")
        return
    drawings = [("timeline picture", "timeline.png", viz.timeline)]
    if hang:
        drawings.append(("wait-for graph", "wait_for.png", viz.wait_for))
    notes = trace.notes                       # (reads notes.txt and every event: once)
    for what, name, draw in drawings:
        try:
            path = _write_private(directory, name,
                                  lambda f: _save_with_notes(draw(trace), notes, f))
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
    if os.path.isdir(path):
        _check_owner("--finish", directory, path)
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


def _write_private(directory, name, write):
    """Write `name` in `directory` with `write(binary file)`, private and never over a file
    that is there already (recorder.create_private); its path. A name already taken (by a file
    that appeared during the run, or an earlier --finish) is said, with the one used instead."""
    f, path = recorder.create_private(directory, name)
    try:
        with f:
            write(f)
    except BaseException:
        os.unlink(path)
        raise
    if os.path.basename(path) != name:
        say(f"{os.path.join(directory, name)} is there already (an earlier --finish, or a file "
            f"made during the run): left as it is, as mpviz never writes over a file; wrote "
            f"{path}")
    return path


def _json_into(f, data, fast=True):
    """`data` (``to_chrome``'s dict) as JSON into the binary file `f`. Not ``json.dump``: it
    encodes piece by piece in Python (3.8 s for a 290,000-event DataLoader trace); ``json.dumps``
    runs the C encoder, here on slices of the event list (1.1 s, and never the whole text in
    memory at once). The same bytes: JSON puts ", " between a list's items wherever it is cut.
    Where it builds (and `fast`), _speedups/json_events.c encodes the slices instead: the same
    bytes again, in a third of the time (json.dumps makes a str of every key and value, then
    joins them; json_events.c writes their characters into one buffer). A slice it cannot
    encode (a type json converts, or refuses) is json's."""
    events = data.get("traceEvents")
    if not isinstance(events, list):
        f.write(json.dumps(data).encode())
        return
    f.write(b'{"traceEvents": [')
    _events_into(f, events, fast)
    f.write(b"]" + _after_events(data))


def _after_events(data):
    """b', "displayTimeUnit": "ms", ...}': what follows the events' "]" in `data`'s JSON."""
    rest = json.dumps({k: v for k, v in data.items() if k != "traceEvents"})
    return b"}" if rest == "{}" else b", " + rest[1:].encode()


def _events_into(f, events, fast=True):
    """`events` as JSON list items, ", " between them, no brackets, into `f`; how many."""
    dumps = _fast_dumps() if fast else None
    for at in range(0, len(events), _JSON_SLICE):
        if at:
            f.write(b", ")
        part = events[at:at + _JSON_SLICE]
        try:
            text = dumps(part) if dumps is not None else None
        except TypeError:
            text = None
        f.write(text[1:-1] if text is not None else _EVENTS_ENCODER.encode(part)[1:-1].encode())
    return len(events)


def _fast_dumps():
    """_speedups/json_events.c's ``dumps`` (bytes, as ``json.dumps(obj).encode()``), or None
    where it cannot be built (then json encodes: the same bytes, slower)."""
    from .._speedups import build, source
    module, _why = build(source("json_events.c"), "mpviz._speedups._json_events")
    return None if module is None else module.dumps


_JSON_SLICE = 20_000                       # events encoded at once by _json_into
# json.dumps's own encoder, less its check for cycles: the events are fresh dicts of
# to_chrome, never one inside itself, and the check keeps every dict's id on the way (8% of
# the encoding). The same bytes.
_EVENTS_ENCODER = json.JSONEncoder(check_circular=False)


def _save_with_notes(fig, notes, f):
    """Save `fig` as PNG into the file `f`; under it, in red, what could not be recorded (a
    picture is believed: one that is missing something says so on itself, not only on the
    terminal)."""
    if not notes:
        fig.savefig(f, format="png")
        return
    from .trace import drawing
    drawing().notes_under(fig, notes)
    fig.savefig(f, format="png", bbox_inches="tight")


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
    """Remove the stacks folder's empty files (every process made one, in case it hung), and
    the stacks written at a SIGINT (the report said what they hold)."""
    from .watchdog import STACKS
    folder = os.path.join(directory, STACKS)
    try:
        for f in os.listdir(folder):
            path = os.path.join(folder, f)
            if os.path.getsize(path) == 0 or f.endswith(autostart.INTERRUPT_SUFFIX):
                os.unlink(path)
        os.rmdir(folder)
    except OSError:
        pass                               # not empty: the stacks stay, next to the trace
