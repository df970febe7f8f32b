"""Programs that treat the recorder badly, traced with ``python -m mpviz trace``.

Each case runs a real program (tests/badprog_workers.py) twice, untraced and traced, and checks
that tracing changed nothing the program can see -- its output, its files, its exit status --
and that what could not be recorded is said, on stderr and in the trace (``trace.notes``).
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import mpviz.trace as mt
import mpviz.viz as viz

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
WORKERS = os.path.join(ROOT, "tests", "badprog_workers.py")


def env(**extra):
    return {**os.environ, "PYTHONPATH": ROOT, **extra}


def untraced(cwd, *args, timeout=60):
    return subprocess.run([PY, WORKERS, *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def traced(cwd, *args, options=("--no-plot",), out="out", timeout=90):
    return subprocess.run([PY, "-m", "mpviz", "trace", *options, "-o", out, "--", PY, WORKERS,
                           *args], cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def both(tmp_path, *args, **kw):
    """(untraced run, traced run, the files each left), each in a folder of its own."""
    plain, rec = tmp_path / "plain", tmp_path / "traced"
    plain.mkdir()
    rec.mkdir()
    a = untraced(plain, *args)
    b = traced(rec, *args, **kw)
    return a, b, _files(plain), _files(rec)


def _files(folder):
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}


# --- the recorder's fds, closed or replaced by the program --------------------------------------

def test_a_fork_after_closerange_keeps_the_programs_files(tmp_path):
    # The program reuses the numbers of the recorder's fds (its log, its stacks file); the forked
    # child's recorder must not close "its parent's log" or "its parent's stacks file" (now the
    # program's files: the first file opened gets the stacks file's number, 3) and open its own
    # on that number.
    a, b, plain, rec = both(tmp_path, "fork_after_closerange")
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout) == (0, "child status 0\n"), b.stderr
    assert rec == plain == {"a.txt": "child\nparent\n", "b.txt": "child\n", "c.txt": "child\n"}
    trace = mt.load(tmp_path / "traced" / "out")
    assert not trace.problems                          # no log overwritten by the program
    assert [e.args["how"] for e in trace.of_kind("process.start")] == ["launcher", "exec", "fork"]


def test_dup2_over_the_log_fd_stops_recording_not_the_program(tmp_path):
    a, b, plain, rec = both(tmp_path, "dup2_over_every_fd")
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout) == (0, "wrote through fds 3..9\n"), \
        b.stderr
    assert rec["mine.txt"] == plain["mine.txt"] == "".join(f"{n}\n" for n in range(3, 10))
    assert "recording stopped" in b.stderr and "recorder's log fd" in b.stderr
    trace = mt.load(tmp_path / "traced" / "out")
    assert not trace.problems and trace.of_kind("queue.put")     # kept up to there
    (line,) = trace.notes                                        # said in the trace ...
    assert line.startswith("recording stopped in pid") and "os.dup2?" in line
    assert f"NOT RECORDED: {line}" in b.stderr                  # ... at the end of the report
    assert f"NOT RECORDED: {line}" in viz.summary(trace)        # ... and in the summary


@pytest.mark.timeout(60)
def test_a_hang_after_closerange_writes_no_stacks_into_the_programs_file(tmp_path):
    # The hang watchdog asks for stacks with SIGUSR1; faulthandler writes them to the fd number it
    # was given at start-up -- which the program has closed and reused for its own file.
    run = traced(tmp_path, "hang_after_closerange", options=("--no-plot", "--hang-after", "1"))
    assert run.returncode == 124 and run.stdout == "waiting\n", run.stderr
    assert (tmp_path / "data.txt").read_text() == "data\n"
    assert "closed the file its stacks go to" in run.stderr


@pytest.mark.timeout(60)
def test_a_process_still_starting_is_said_so_and_not_sent_sigusr1(tmp_path):
    # A child under spawn that the watchdog stops before mpviz's start-up in it has opened its
    # stacks file: it was "closed the file its stacks go to -- os.closerange?", a guess at
    # something the program never did. And SIGUSR1 is not sent: its default ends the process.
    from mpviz.trace import session
    child = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"])
    try:
        out = session.capture_stacks([child.pid], {child.pid: "SpawnProcess-1"}, str(tmp_path))
        assert out[child.pid]["stacks"] == (
            "(no stacks captured: it was still starting -- mpviz's start-up in it had not "
            "yet opened the file its stacks go to)"), out
        assert child.poll() is None                     # not sent: still alive
    finally:
        child.kill()
        child.wait()


RECORD_DUP2 = """
import os, sys
import mpviz.trace as mt
fd = os.open("mine.txt", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
with mt.record() as trace:            # (a temporary directory: the notes outlive it)
    for n in range(3, 12):
        if n != fd:
            os.dup2(fd, n)
    for i in range(400):
        mt.mark("work", pad="x" * 100)
for n in range(3, 12):
    os.write(n, b"%d " % n)
print(open("mine.txt").read())
print(trace.notes)
"""


def test_record_keeps_the_note_when_the_program_takes_its_fd(tmp_path):
    run = subprocess.run([PY, "-W", "ignore", "-c", RECORD_DUP2], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    files, notes = run.stdout.splitlines()
    assert files == " ".join(str(n) for n in range(3, 12)) + " "
    (note,) = eval(notes)                      # said, even with the warning silenced
    assert "recording stopped" in note and "os.dup2?" in note


# --- a torch that mpviz cannot see inside ---------------------------------------------------------

FAKE_TORCH = {            # the program's own import: a torch package of another version
    "torch/__init__.py": '__version__ = "1.4.0"\nfrom . import multiprocessing\n',
    "torch/multiprocessing/__init__.py": "from multiprocessing import *\n",
}


def _with_fake_torch(tmp_path):
    """Write the fake torch 1.4.0 under tmp_path/site; the environment that imports it."""
    for name, text in FAKE_TORCH.items():
        (tmp_path / "site" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "site" / name).write_text(text)
    return env(PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path / "site")]))


@pytest.mark.timeout(60)
def test_an_unsupported_torch_is_said_never_counted_as_zero(tmp_path):
    both_env = _with_fake_torch(tmp_path)
    command = [PY, WORKERS, "old_torch"]
    a = subprocess.run(command, cwd=tmp_path, env=both_env, capture_output=True, text=True,
                       timeout=50)
    b = subprocess.run([PY, "-m", "mpviz", "trace", "--no-plot", "-o", "out", "--", *command],
                       cwd=tmp_path, env=both_env, capture_output=True, text=True, timeout=50)
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout) == (0, "1.4.0 1000\n"), b.stderr
    trace = mt.load(tmp_path / "out")
    program = {p.pid for p in trace.processes() if p.how in ("exec", "fork")}
    assert len(program) == 2
    # every process that had torch says so: the forked child too, not only the importer
    assert {e.pid for e in trace.of_kind("torch.unsupported")} == program
    (note,) = trace.notes                     # one line for both: the same reason
    assert "torch 1.4.0" in note and "unknown, not zero" in note
    assert note.startswith("pids ") and all(str(pid) in note for pid in program), note
    assert "NOT RECORDED: pid" in b.stderr and "torch 1.4.0" in b.stderr
    summary = viz.summary(trace)
    assert "0 segments (torch's: unknown, NOT recorded)" in summary
    assert "NOT recorded in 2 processes" in summary


@pytest.mark.timeout(60)
def test_many_children_under_an_unsupported_torch_make_one_line_not_one_each(tmp_path):
    both_env = _with_fake_torch(tmp_path)
    b = subprocess.run([PY, "-m", "mpviz", "trace", "--no-plot", "-o", "out", "--", PY, WORKERS,
                        "old_torch", "12"], cwd=tmp_path, env=both_env, capture_output=True,
                       text=True, timeout=50)
    assert (b.returncode, b.stdout) == (0, "1.4.0 1000\n"), b.stderr
    trace = mt.load(tmp_path / "out")
    (note,) = trace.notes
    assert note.startswith("13 processes (pids ") and ", ...)" in note, note
    said = [line for line in b.stderr.splitlines() if "NOT RECORDED:" in line]
    assert len(said) == 1 and "13 processes" in said[0], b.stderr


# --- a launcher killed by SIGKILL --------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_killed_launchers_trace_is_finished_by_the_command_it_printed(tmp_path):
    errfile = tmp_path / "stderr.txt"
    with open(errfile, "w") as errs:
        launcher = subprocess.Popen([PY, "-m", "mpviz", "trace", "-o", "out", "--", PY, WORKERS,
                                     "sleeper", "1"], cwd=tmp_path, env=env(),
                                    stdout=subprocess.PIPE, stderr=errs, text=True)
        program = int(launcher.stdout.readline())     # it runs (and the launcher has spoken)
        launcher.kill()
        launcher.wait()
        assert launcher.stdout.read() == "woke\n"     # the program went on to its end ...
        launcher.stdout.close()
    err = errfile.read_text()
    assert f"the launcher (pid {launcher.pid}) is gone" in err      # ... and said so there
    assert not (tmp_path / "out" / "trace.json").exists()
    assert (tmp_path / "out" / ".stacks").exists()              # (tidied by --finish)
    # the command the launcher printed at its start, run as printed:
    (command,) = [line.split("then writes")[0].rsplit("; ", 1)[1].strip() for line in err.splitlines()
                  if "--finish" in line and line.startswith("mpviz trace: recording into")]
    assert command == f"python -m mpviz trace --finish {tmp_path / 'out'}"
    done = subprocess.run([PY, *command.split()[1:]], cwd=tmp_path, env=env(),
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "trace.json").exists()
    assert not (tmp_path / "out" / ".stacks").exists()
    trace = mt.load(tmp_path / "out")
    assert any(p.pid == program and p.exit_ns for p in trace.processes())
    (note,) = trace.notes
    assert note.startswith(f"the launcher (pid {launcher.pid}) was killed before the program")
    assert f"NOT RECORDED: {note}" in done.stderr
    again = subprocess.run([PY, *command.split()[1:]], cwd=tmp_path, env=env(),
                           capture_output=True, text=True, timeout=50)
    assert again.returncode == 0 and mt.load(tmp_path / "out").notes == [note]   # said once


def test_finish_refuses_a_directory_without_a_recording(tmp_path):
    run = subprocess.run([PY, "-m", "mpviz", "trace", "--finish", str(tmp_path)], cwd=tmp_path,
                         env=env(), capture_output=True, text=True, timeout=50)
    assert run.returncode == 2 and "no recording there" in run.stderr and "Fix:" in run.stderr


# --- os._exit: no atexit, no flush -------------------------------------------------------------

def test_os_exit_keeps_every_event_and_the_exit_codes(tmp_path):
    from mpviz.trace import analysis as st
    a, b, _, _ = both(tmp_path, "os_exit", "5")
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout) == (5, "child exitcode 6\n"), \
        b.stderr
    trace = mt.load(tmp_path / "traced" / "out")
    assert not trace.problems and not trace.notes
    procs = {p.how: p for p in trace.processes()}
    assert (procs["exec"].exitcode, procs["fork"].exitcode) == (5, 6)
    assert procs["exec"].exit_ns and procs["fork"].exit_ns
    # everything the program recorded before os._exit is there: the child's start, its join
    program = procs["exec"].pid
    assert [e.kind for e in trace.events if e.pid == program and e.kind.startswith("process.")] \
        [:2] == ["process.start", "process.launch"]
    end = st.state_at(trace)
    assert {p.pid for p in end.processes} & {program, procs["fork"].pid} == set()  # drawn ended


# --- many processes --------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_hundreds_of_forked_children_are_all_recorded_cheaply(tmp_path, monkeypatch):
    # (300 here to keep the suite quick; 1000 were measured by hand, see the commit message)
    n = 300
    a, b, _, _ = both(tmp_path, "many", str(n), "fork", options=("--plot",), timeout=110)
    assert (b.returncode, b.stdout) == (a.returncode, a.stdout), b.stderr
    assert b.stdout == f"{n} children, exit codes summed {sum(i % 7 for i in range(n))}\n"
    out = tmp_path / "traced" / "out"
    logs = [p for p in out.iterdir() if p.suffix == ".mpvlog"]
    assert len(logs) == n + 2                               # the launcher, the program, n children
    assert max(p.stat().st_blocks * 512 for p in logs) <= 64 << 10    # sparse: ~16 KiB each
    # one line for the children whose end no recorded parent saw (os.waitpid is not recorded)
    assert sum("how each ended was not recorded" in line for line in b.stderr.splitlines()) == 1
    assert "how it ended" not in b.stderr
    # the timeline keeps 40 lanes and says in its title what it left out (viz/timeline.py)
    assert "timeline picture:" in b.stderr and (out / "timeline.png").stat().st_size > 0
    # reading it does not read every log's empty megabyte (it did: 1 MiB each, 18 s for 1000)
    read = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, size, off: read.append(size) or real(fd, size, off))
    trace = mt.load(out)
    monkeypatch.undo()
    assert len(trace.processes()) == n + 2 and not trace.problems
    # a live view, or the hang watchdog (ten polls a second), reads a dead writer's log once
    from mpviz.trace.reader import LogReader
    live = LogReader(out)
    assert len(live.poll()) == len(trace.events)
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    assert live.poll() == []
    monkeypatch.undo()
    assert opened == []
    assert sum(read) < 128 * 1024 * len(logs), f"{sum(read) / 2**20:.0f} MiB read for {len(logs)} logs"


PICTURE_WITH_NOTES = """
import sys
import matplotlib
matplotlib.use("Agg")
import mpviz.trace as mt, mpviz.viz as viz
from mpviz.trace import launcher
trace = mt.Trace(events=[(1, 10, 10, "process.start", {"how": "exec", "name": "p"}),
                         (2, 10, 10, "torch.unsupported", {"reason": "torch 1.4.0 is not "
                                                           "supported", "torch": True})])
fig = viz.timeline(trace)
launcher._save_with_notes(fig, trace.notes, sys.argv[1])
print([t.get_text() for t in fig.texts if "NOT RECORDED" in t.get_text()])
"""


def test_a_saved_picture_carries_the_notes(tmp_path):
    # (in a child process: matplotlib keeps its font files open, which the leak check would see)
    run = subprocess.run([PY, "-c", PICTURE_WITH_NOTES, str(tmp_path / "t.png")], env=env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "t.png").stat().st_size > 0
    (text,) = eval(run.stdout)
    assert "torch 1.4.0" in text and "unknown, not zero" in text
