"""`python -m mpviz trace`: a hang's verdict, signals, refusals, its cost, and log sizes.

Each test runs the real launcher (``python -m mpviz trace``) on a real program in a subprocess:
the launcher puts the program in a session of its own and installs signal handlers, which a
test must not do to the pytest process itself.
"""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import mpviz.trace as mt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

JOIN_BEFORE_GET = textwrap.dedent("""
    import multiprocessing as mp

    def produce(q):
        q.put(b"x" * (1 << 20))   # 1 MiB: the feeder thread blocks on the full pipe

    if __name__ == "__main__":
        ctx = mp.get_context({method!r})
        q = ctx.Queue()
        p = ctx.Process(target=produce, args=(q,))
        p.start()
        p.join()                  # waits for the child, which waits for someone to get
        print(len(q.get()))
""")

SLEEPER = textwrap.dedent("""
    import multiprocessing as mp
    import time

    def nap():
        print("ready", flush=True)      # once both are where the signal will find them
        time.sleep(60)

    if __name__ == "__main__":
        p = mp.get_context("fork").Process(target=nap)
        p.start()
        time.sleep(60)
""")


def env(**extra):
    return dict(os.environ, PYTHONPATH=ROOT, **extra)


def mpviz(*args, cwd, timeout=90, **kw):
    return subprocess.run([PY, "-m", "mpviz", *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout, **kw)


def gone(pid, seconds=3.0):
    """True once `pid` no longer runs (a zombie waiting for init counts as gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)      # polling /proc for a process that is not our child
    return False


# --- a hang: verdict, stacks, trace, exit status, nothing left ------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_join_before_get_gets_a_verdict(tmp_path, method):
    (tmp_path / "prog.py").write_text(JOIN_BEFORE_GET.format(method=method))
    out = tmp_path / "out"
    t0 = time.monotonic()
    run = mpviz("trace", "--hang-after", "2", "-o", str(out), "--", PY, "prog.py",
                cwd=tmp_path)
    took = time.monotonic() - t0
    print(f"hang found and reported in {took:.1f} s")
    assert run.returncode == 124, run.stderr
    err = run.stderr
    assert "HANG: DEADLOCK -- for" in err and "nobody can ever move" in err
    assert "pid" in err and "(prog.py)" in err              # the program, by its script
    assert "join (process.py" in err                         # where its main thread waited
    assert "... <module> (prog.py:12)" in err                # ... and the program's line
    assert "_feed (queues.py" in err                         # where the child's feeder did
    assert "how it ended was not recorded" not in err        # the watchdog killed it: known
    for name in ("trace.json", "timeline.png", "wait_for.png"):
        assert (out / name).exists(), name
        assert str(out / name) in err
    trace = mt.load(out)
    assert trace.verdict and trace.verdict.strip() in err   # kept with the trace, as printed
    program = [p for p in trace.processes() if p.how == "exec"]
    child = [p for p in trace.processes() if p.ppid in {q.pid for q in program}]
    assert len(program) == 1 and len(child) == 1
    stuck = {e.args["pid"] for e in trace.of_kind("watchdog.stuck")}
    assert stuck == {program[0].pid, child[0].pid}
    (kill,) = trace.of_kind("watchdog.kill")
    assert set(kill.args["pids"]) >= {program[0].pid, child[0].pid}
    for p in program + child:
        assert gone(p.pid), f"pid {p.pid} ({p.name}) still runs"
        assert p.signal == "SIGKILL"          # drawn as killed, not as "still running"
    from mpviz import viz
    summary = viz.summary(trace)
    assert summary.startswith("2 processes,")     # the launcher/watchdog are not counted
    assert "at your line prog.py:12 in <module>()" in summary
    assert took < 60


@pytest.mark.timeout(60)
def test_hang_after_zero_turns_the_watchdog_off(tmp_path):
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(1.5)\n")
    run = mpviz("trace", "--hang-after", "0", "--no-plot", "-o", str(tmp_path / "o"), "--",
                PY, "prog.py", cwd=tmp_path)
    assert run.returncode == 0 and "HANG" not in run.stderr
    assert not (tmp_path / "o" / ".stacks").exists()


@pytest.mark.timeout(60)
def test_a_program_that_ends_while_its_stacks_are_taken_gets_no_hang_verdict(tmp_path):
    # On a busy machine, taking the stacks after the judgment can take seconds; a wait with a
    # deadline may run out meanwhile and the program end by itself. Said before: "HANG:
    # STALLED ... mpviz stopped 0 process(es) with SIGKILL" and exit 124, for a program that
    # ended well. Here the window is made sure of: the program blocks SIGUSR1, so its stacks
    # never come and the capture waits its whole 1.5 s, while the 1.8 s sleep runs out.
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        time.sleep(1.8)
        print("done", flush=True)
    """))
    out = tmp_path / "out"
    run = mpviz("trace", "--hang-after", "1", "--no-plot", "-o", str(out), "--", PY, "prog.py",
                cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "done" in run.stdout
    assert "HANG" not in run.stderr and "stopped 0 process" not in run.stderr, run.stderr
    assert re.search(r"no hang: the program ended by itself \(exit status 0\) while mpviz "
                     r"took its stacks, after 1\.\d s with no progress seen \(--hang-after "
                     r"1\)\. A wait with a deadline longer than --hang-after looks like a "
                     r"stall until it runs out; a longer --hang-after gives it the time", run.stderr), run.stderr
    trace = mt.load(out)
    assert not trace.verdict and not trace.of_kind("watchdog.kill")
    (program,) = [p for p in trace.processes() if p.how == "exec"]
    assert program.exitcode == 0 and program.signal is None


@pytest.mark.timeout(60)
def test_a_program_that_dies_of_a_signal_while_its_stacks_are_taken_still_gets_its_verdict(
        tmp_path):
    # A death by a signal is no end by itself: the verdict stands, the rest is killed, and the
    # death is said. (Seen: faulthandler's dump for SIGUSR1 crashed hang_logging_pool.py's main
    # process, 3 runs in 18 under load; the first version of the "ended by itself" rule then
    # left its hung workers running.) Here the program kills itself, without a stacks dump.
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import multiprocessing as mp, os, signal, time
        if __name__ == "__main__":
            p = mp.get_context("fork").Process(target=time.sleep, args=(60,))
            p.start()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            time.sleep(1.8)
            os.kill(os.getpid(), signal.SIGSEGV)
    """))
    run = mpviz("trace", "--hang-after", "1", "--no-plot", "-o", str(tmp_path / "out"), "--",
                PY, "prog.py", cwd=tmp_path)
    assert run.returncode == 124, run.stderr
    assert "HANG: STALLED" in run.stderr and "no hang" not in run.stderr, run.stderr
    assert re.search(r"while mpviz took the stacks, the program's main process \(pid \d+\) "
                     r"died of SIGSEGV\n", run.stderr + "\n"), run.stderr
    assert "faulthandler" not in run.stderr, run.stderr         # (its dump was not cut short)
    child = [p for p in mt.load(tmp_path / "out").processes() if p.name == "ForkProcess-1"]
    assert child and gone(child[0].pid), "the program's child was left running"


# --- signals to the launcher ------------------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_reaches_the_program(tmp_path, sig):
    (tmp_path / "prog.py").write_text(SLEEPER)
    out = tmp_path / "out"
    errfile = tmp_path / "stderr.txt"
    with open(errfile, "w") as errs:       # (an orphan of SIGTERM keeps a pipe open: a file)
        launcher = subprocess.Popen([PY, "-m", "mpviz", "trace", "-o", str(out), "--", PY,
                                     "prog.py"], cwd=tmp_path, env=env(),
                                    stdout=subprocess.PIPE, stderr=errs, text=True)
    try:
        assert launcher.stdout.readline() == "ready\n"
        launcher.send_signal(sig)
        launcher.wait(timeout=60)
    finally:
        launcher.stdout.close()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    err = errfile.read_text()
    assert launcher.returncode == 128 + sig, err      # the program's status, as a shell says
    assert f"passed {sig.name} on to the program" in err
    assert str(out / "trace.json") in err and (out / "trace.json").exists()
    assert (out / "timeline.png").exists()           # a run ended by a signal is drawn
    trace = mt.load(out)
    (program,) = [p for p in trace.processes() if p.how == "exec"]
    assert program.signal == sig.name
    if sig != signal.SIGTERM:   # a terminal's SIGINT/SIGHUP go to the whole process group
        for p in trace.processes():
            if p.how == "fork":
                assert gone(p.pid)
    for p in trace.processes():                      # (SIGTERM's orphan, as without mpviz)
        if p.how == "fork" and not gone(p.pid, 0.1):
            os.kill(p.pid, signal.SIGKILL)


# --- refusals: before the program runs, one line, exit 2 --------------------------------------

@pytest.mark.parametrize("where", ["/proc/nope/out", "a_file"])
def test_an_unwritable_output_is_refused_before_the_program_starts(tmp_path, where):
    (tmp_path / "a_file").write_text("")
    run = mpviz("trace", "-o", where, "--", PY, "-c", "open('marker', 'w')", cwd=tmp_path)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "Fix:" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "marker").exists()


def test_an_output_that_holds_a_recording_is_refused(tmp_path):
    first = mpviz("trace", "--no-plot", "-o", "out", "--", "true", cwd=tmp_path)
    assert first.returncode == 0
    again = mpviz("trace", "-o", "out", "--", "true", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a recording" in again.stderr


def test_a_failed_start_leaves_no_folder(tmp_path):
    run = mpviz("trace", "-o", "new", "--", "/nonexistent/program", cwd=tmp_path)
    assert run.returncode == 127
    assert len(run.stderr.strip().splitlines()) == 1 and "cannot run" in run.stderr
    assert os.listdir(tmp_path) == []
    run = mpviz("trace", "--", "/nonexistent/program", cwd=tmp_path)   # the default folder
    assert run.returncode == 127 and os.listdir(tmp_path) == []


@pytest.mark.timeout(60)
def test_exit_status_is_the_programs_and_no_plot_draws_nothing(tmp_path):
    run = mpviz("trace", "--no-plot", "-o", "out", "--", PY, "-c", "raise SystemExit(3)",
                cwd=tmp_path)
    assert run.returncode == 3
    assert not (tmp_path / "out" / "timeline.png").exists()
    assert (tmp_path / "out" / "trace.json").exists()


@pytest.mark.timeout(60)
def test_the_launcher_records_its_own_end(tmp_path):
    from mpviz import viz
    from mpviz.viz import WORDS
    run = mpviz("trace", "--no-plot", "-o", "out", "--", PY, "-c", "raise SystemExit(3)",
                cwd=tmp_path)
    assert run.returncode == 3
    trace = mt.load(tmp_path / "out")
    (launcher,) = [p for p in trace.processes() if p.how == "launcher"]
    (program,) = [p for p in trace.processes() if p.how == "exec"]
    # it ended after the program, with the status it exits with (the program's)
    assert launcher.exit_ns is not None and launcher.exit_ns >= program.exit_ns
    assert launcher.exitcode == 3
    # so no lane is drawn "still running when the trace ends"
    fig = viz.timeline(trace)
    shown = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert WORDS["running"] not in shown


def test_run_refuses_an_unwritable_plot_before_running(tmp_path):
    t0 = time.monotonic()
    run = mpviz("run", "queue-sharing", "--plot", "/proc/nope/x.png", cwd=tmp_path)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1 and "Fix:" in run.stderr
    assert run.stdout == ""                          # no verdict: the case did not run
    assert time.monotonic() - t0 < 20


def test_list_into_a_closed_pipe_ends_quietly(tmp_path):
    proc = subprocess.Popen([PY, "-m", "mpviz", "list", "-v"], cwd=tmp_path,
                            env=env(PYTHONUNBUFFERED=""), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                              # as `| head` does once it has enough
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=30) == 141 and err == b""   # 128 + SIGPIPE, as `yes | head`


# --- what tracing costs ---------------------------------------------------------------------------

def test_tracing_true_is_cheap(tmp_path):
    def best(cmd, n=5):
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            subprocess.run([c.replace("{i}", str(i)) for c in cmd], cwd=tmp_path, env=env(),
                           capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        return min(times)

    untraced = best(["true"])
    traced = best([PY, "-m", "mpviz", "trace", "-o", "t{i}", "--", "true"])
    print(f"`true`: {untraced * 1e3:.0f} ms; traced: {traced * 1e3:.0f} ms "
          f"(+{(traced - untraced) * 1e3:.0f} ms, best of 5)")
    assert traced - untraced < 1.2     # generous: a loaded machine; ~0.2 s when it is idle
    imports = subprocess.run([PY, "-X", "importtime", "-m", "mpviz", "trace", "-o", "ti", "--",
                              "true"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    assert "matplotlib" not in imports.stderr       # nothing drawn: nothing to import
    assert not (tmp_path / "t0" / "timeline.png").exists()


LOGGER = textwrap.dedent("""
    import os, signal, sys
    import mpviz.trace as mt
    with mt.record(sys.argv[1]):
        for i in range(int(sys.argv[2])):
            mt.mark("m", i=i, pad="p" * (i % 300))
        os.kill(os.getpid(), signal.SIGKILL)      # no clean exit: nothing may be lost
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pure", ["0", "1"], ids=["C-writer", "Python-writer"])
def test_a_log_takes_disk_in_proportion_to_its_events(tmp_path, pure):
    (tmp_path / "logger.py").write_text(LOGGER)
    sizes = {}
    for n in (1, 20000):                 # 20000 marks: ~4 MB, several reservations and chunks
        out = tmp_path / f"log{n}"
        proc = subprocess.run([PY, "logger.py", str(out), str(n)], cwd=tmp_path,
                              env=env(MPVIZ_PURE_PYTHON=pure), capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        (log,) = [f for f in os.listdir(out) if f.endswith(".mpvlog")]
        sizes[n] = os.stat(out / log).st_blocks * 512
        trace = mt.load(out)
        assert [e.args["i"] for e in trace.of_kind("mark")] == list(range(n))
        assert trace.problems == []
    print(f"on disk: 1 event {sizes[1] // 1024} KiB, 20000 events {sizes[20000] // 1024} KiB")
    assert sizes[1] <= 64 << 10                      # was a whole 1 MiB chunk
    assert sizes[20000] < 2 * 20000 * 420            # about what was written, not chunks


# --- the same verdict from record(hang_after=S) ------------------------------------------------

RECORD_HANG = textwrap.dedent("""
    import os, sys
    import multiprocessing as mp
    import mpviz.trace as mt
    from mpviz.trace.watchdog import HangError

    def produce(q):
        q.put(b"x" * (1 << 20))

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        try:
            with mt.record(hang_after=2) as trace:
                q = ctx.Queue()
                p = ctx.Process(target=produce, args=(q,))
                p.start()
                p.join()          # returns once the watchdog killed the child ...
                q.get()           # ... and this wait is interrupted
        except HangError as exc:
            stuck = sorted(e.args["pid"] for e in trace.of_kind("watchdog.stuck"))
            print("HangError", exc.verdict == trace.verdict, stuck == sorted([os.getpid(), p.pid]),
                  p.exitcode)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_record_with_hang_after_gives_the_same_verdict(tmp_path, method):
    (tmp_path / "prog.py").write_text(RECORD_HANG)
    run = subprocess.run([PY, "prog.py", method], cwd=tmp_path, env=env(), capture_output=True,
                         text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["HangError", "True", "True", "-9"], run.stderr
    assert "mpviz: HANG: DEADLOCK -- for" in run.stderr
    assert "... <module> (prog.py:17)" in run.stderr        # the line that waited: join
    assert "_feed (queues.py" in run.stderr
    # who waits for whom, as the launcher says it: the recording process is "main", and its
    # join is there (its own watchdog's log made it read as the watchdog: its waits were lost,
    # and the child was called "main")
    assert re.search(r"main's main thread waits: join \w*Process-1 \(pid \d+\)", run.stderr), \
        run.stderr
    assert "has done its work but cannot exit" in run.stderr
    assert "HANG AT EXIT: main " not in run.stderr, run.stderr
    assert "Traceback" not in run.stderr             # the helpers it shares were left alone
    assert "INTERRUPTED" not in run.stderr           # its SIGINT only wakes the block's wait


@pytest.mark.timeout(120)
def test_record_with_hang_after_ends_the_hang_of_a_program_started_with_sigint_ignored(tmp_path):
    # `nohup python prog.py &`: a shell starts a background job with SIGINT ignored, so the
    # watchdog's SIGINT alone would leave the block waiting forever
    (tmp_path / "prog.py").write_text(RECORD_HANG)
    run = subprocess.run(["bash", "-c", f"trap '' INT; exec {PY} prog.py fork"], cwd=tmp_path,
                         env=env(), capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["HangError", "True", "True", "-9"], run.stderr
    assert "mpviz: HANG: DEADLOCK -- for" in run.stderr


def test_record_refuses_a_bad_hang_after():
    with pytest.raises(ValueError, match="hang_after"):
        with mt.record(hang_after=-1):
            pass


# --- pictures of a traced program are about the program -------------------------------------------

POOL_FAILS = textwrap.dedent("""
    import multiprocessing as mp

    def work(x):
        if x == 3:
            raise ValueError("no threes")
        return x

    if __name__ == "__main__":
        with mp.get_context("spawn").Pool(2) as pool:
            try:
                pool.map(work, range(6), chunksize=1)
            except ValueError as e:
                print("failed:", e)
""")


@pytest.mark.timeout(120)
def test_pictures_name_the_program_and_draw_a_failed_task(tmp_path):
    from mpviz import viz
    from mpviz.viz import WORDS
    (tmp_path / "prog.py").write_text(POOL_FAILS)
    run = mpviz("trace", "--no-plot", "-o", "out", "--", PY, "prog.py", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout == "failed: no threes\n", run.stderr
    trace = mt.load(tmp_path / "out")
    labels = viz.process_labels(trace)
    by_how = {p.how: labels[p.pid] for p in trace.processes()}
    assert by_how["launcher"] == "mpviz trace" and by_how["exec"] == "prog.py"
    assert "main" not in labels.values()
    assert "from 3 processes" in run.stderr          # the program and its workers: no launcher
    fig = viz.timeline(trace)
    shown = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert WORDS["task_failed"] in shown


def test_wait_for_without_an_instant_shows_the_most_waiters():
    import threading
    from mpviz import viz
    from mpviz.trace import analysis as st
    lock = threading.Lock()
    with mt.record(threading_locks=True) as trace:
        lock = threading.Lock()
        lock.acquire()
        started = threading.Barrier(4)

        def wait():
            started.wait()
            with lock:
                pass

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for t in threads:
            t.start()
        started.wait()
        while sum(e.kind == "lock.wait" for e in trace.events) < 3:
            trace.refresh()      # until all three are recorded waiting (each records, then waits)
        lock.release()
        for t in threads:
            t.join()
    at = st.busiest_wait(trace)
    assert at is not None
    (lk,) = [lk for lk in st.state_at(trace, at).locks if lk.waiters]
    assert len(lk.waiters) == 3 or len(lk.waiters) == 2     # (one may get it at release)
    title = viz.wait_for(trace).axes[0].get_title(loc="left")
    assert f"at {(at - trace.events[0].ts_ns) / 1e6:.1f} ms" in title


# --- bad input: a program that closes or replaces the recorder's fd ------------------------------

FD_CLOSER = textwrap.dedent("""
    import os, sys
    import mpviz.trace as mt
    from mpviz.trace import recorder
    with open("victim.txt", "w") as f:
        f.write("mine\\n")
    with mt.record(sys.argv[2]):
        mt.mark("before")
        if sys.argv[1] == "dup2":      # another file where the log's fd was
            os.dup2(os.open("victim.txt", os.O_RDWR), recorder._log.fd)
        else:
            os.close(recorder._log.fd)
        for i in range(200):           # enough to need more of the log reserved on disk
            mt.mark("after", pad="x" * 200)
    print(os.path.getsize("victim.txt"), len(mt.load(sys.argv[2]).of_kind("mark")))
""")


@pytest.mark.parametrize("how", ["dup2", "close"])
def test_a_program_that_takes_the_logs_fd_loses_recording_not_data(tmp_path, how):
    (tmp_path / "prog.py").write_text(FD_CLOSER)
    run = subprocess.run([PY, "prog.py", how, "out"], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    size, marks = map(int, run.stdout.split())
    assert size == 5                                 # the program's file is untouched
    assert 1 < marks < 201                           # what was recorded before is kept
    assert "recording stopped" in run.stderr and "recorder's log fd" in run.stderr


# --- bad input: os._exit, a killed launcher ----------------------------------------------------

def test_a_process_ended_by_os_exit_is_named(tmp_path):
    (tmp_path / "prog.py").write_text("import os, time\nif os.fork() == 0:\n    os._exit(7)\n"
                                      "time.sleep(0.3)\n")    # nobody waits for the child
    run = mpviz("trace", "--no-plot", "-o", "out", "--", PY, "prog.py", cwd=tmp_path)
    assert run.returncode == 0
    assert "how it ended was not recorded (os._exit" in run.stderr


@pytest.mark.timeout(60)
def test_a_killed_launcher_is_reported_by_its_program(tmp_path):
    (tmp_path / "prog.py").write_text("import os, time\nprint(os.getpid(), flush=True)\n"
                                      "time.sleep(1)\n")
    errfile = tmp_path / "stderr.txt"
    with open(errfile, "w") as errs:
        launcher = subprocess.Popen([PY, "-m", "mpviz", "trace", "-o", "out", "--", PY,
                                     "prog.py"], cwd=tmp_path, env=env(),
                                    stdout=subprocess.PIPE, stderr=errs, text=True)
    program = int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    assert launcher.stdout.read() == ""                # EOF: the program has exited
    launcher.stdout.close()
    assert gone(program)
    assert f"the launcher (pid {launcher.pid}) is gone" in errfile.read_text()
    assert mt.load(tmp_path / "out").of_kind("process.exit")   # its logs are all there


# --- waiting for time or for the user is not a hang ------------------------------------------

@pytest.mark.timeout(60)
def test_sleeping_or_reading_the_terminal_is_not_a_hang(tmp_path):
    import pty
    # sleeps that each end within --hang-after are progress (the rule is the same in every
    # thread: see tests/test_hang_classes.py); a terminal read waits for the user, for ever
    (tmp_path / "prog.py").write_text("import time\nfor _ in range(4):\n    time.sleep(0.6)\n"
                                      "print('typed:', input())\n")
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([PY, "-m", "mpviz", "trace", "--hang-after", "1", "--no-plot",
                                 "-o", "out", "--", PY, "prog.py"], cwd=tmp_path, env=env(),
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        time.sleep(5)        # the user takes a while to type: 2.4 s of sleeps, then ~2.6 s
        os.write(master, b"hello\n")
        out, err = proc.communicate(timeout=40)
    finally:
        os.close(master)
        os.close(slave)
    assert proc.returncode == 0, err
    assert out.endswith("typed: hello\n") and "HANG" not in err


_BROKEN_WATCHDOG = r"""
import sys
import mpviz.trace.watchdog as w
from mpviz.trace import launcher

def poll(self):
    raise RuntimeError("a bug in the watchdog, made for this test")

w.Watchdog.poll = poll
sys.exit(launcher.run(sys.argv[2:], output=sys.argv[1], hang_after=1.0, plot=False))
"""


@pytest.mark.timeout(60)
def test_a_watchdog_that_raises_is_said_and_the_program_still_watched_to_its_end(tmp_path):
    # the launcher once died of a bug in the watchdog (a TypeError in a verdict's words): the
    # program ran on, orphaned and unwatched -- two hung test programs spun for an hour
    program = "import time\ntime.sleep(2.5)\nprint('done', flush=True)\n"
    run = subprocess.run([sys.executable, "-c", _BROKEN_WATCHDOG, str(tmp_path / "t"),
                          sys.executable, "-c", program], capture_output=True, text=True,
                         timeout=50)
    assert run.returncode == 0 and "done" in run.stdout, run.stderr
    assert ("mpviz trace: the hang watchdog failed -- a bug in mpviz, not in your program "
            "(please report it") in run.stderr, run.stderr
    assert "RuntimeError: a bug in the watchdog, made for this test" in run.stderr, run.stderr
    assert os.path.exists(tmp_path / "t" / "trace.json"), run.stderr
