"""Three hangs a learner meets, judged in words by `mpviz trace` and ``record()`` (issue 27).

Each test runs a real program from tests/exit_programs/, written as its author would write it,
in real processes, and asserts the words of the verdict:

* a hang at interpreter exit: a worker fills its queue's pipe, and exits -- its feeder thread is
  joined at exit while the main program joins the worker before reading (CPython issue 91594);
* a Pool worker that exits inside a task: the Pool waits for that result for ever (bpo-22393),
  while the replacement worker it started is idle, not stuck;
* Ctrl-C, to the launcher's process group as a terminal sends it, and to a ``record()`` block's
  process group as Jupyter's "interrupt" sends it: the same where-everyone-is report first.
"""
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mpviz.trace import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(ROOT, "tests", "exit_programs")
HANG_STATUS = 124
# The programs use the default start method, as their authors would: these hangs are not about
# fork. Up to 3.13 that is fork; 3.14 made it forkserver (its Pool's workers are named so).
DEFAULT_START = multiprocessing.get_all_start_methods()[0]     # (the first is the default)
POOL_WORKER = {"fork": "ForkPoolWorker", "spawn": "SpawnPoolWorker",
               "forkserver": "ForkServerPoolWorker"}[DEFAULT_START]


def trace(program, *args, hang_after=1, directory):
    """Run tests/exit_programs/`program` under ``python -m mpviz trace``; (status, stderr)."""
    done = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--hang-after", str(hang_after),
                           "--no-plot", "-o", str(directory), "--", sys.executable,
                           os.path.join(PROGRAMS, program), *args],
                          capture_output=True, text=True, timeout=90, env=_env())
    return done.returncode, done.stderr


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


# --- c. a hang at interpreter exit -------------------------------------------------------------

def test_a_worker_that_fills_its_queue_and_is_joined_first_hangs_at_exit_and_the_verdict_says_so(
        tmp_path):
    status, err = trace("results_join_first.py", directory=tmp_path)
    assert status == HANG_STATUS, err
    # the chain, each wait in words: the feeder's write into the full pipe is recorded too
    assert "Process-1's main thread waits: join thread QueueFeederThread at exit" in err
    assert ("Process-1's QueueFeederThread waits: write 15 B into the full pipe of Queue 1 -- "
            "someone must read Queue 1, and nobody has read it yet") in err
    # and the story: at exit, the feeder, the full pipe of Queue 1, the main program's join
    assert ("HANG AT EXIT: Process-1 has done its work but cannot exit: at exit it waits for "
            "its feeder thread (QueueFeederThread), which waits to write into the full pipe of "
            "Queue 1") in err
    assert ("results_join_first.py's main thread waits in `join` for Process-1 (at your line "
            "results_join_first.py:19 in <module>(): `p.join()`)") in err
    assert "Fix: get everything a process put on a queue before joining it" in err
    assert "sem-" not in err                       # a learner's name, not an internal id
    # the worker waits at exit, not at the parent's line that started it (a forked child's
    # stack goes on below the fork into its parent's: those frames are not where it is)
    assert "`p.start()`" not in err and "results_join_first.py:18" not in err, err


def test_a_worker_joined_by_multiprocessing_at_exit_keeps_its_parent_lane_until_the_kill(
        tmp_path, fonts_loaded):
    status, err = trace("reports_never_joined.py", directory=tmp_path)
    assert status == HANG_STATUS, err
    assert ("reports_never_joined.py's main thread waits in `join` for Process-1 at exit "
            "(multiprocessing joins the children a program did not join)") in err
    assert "into the full pipe of Queue 1" in err
    t = load(str(tmp_path))
    kill = t.of_kind("watchdog.kill")[0].ts_ns
    main, worker = [p for p in t.processes() if p.how in ("exec", DEFAULT_START)]
    # The program recorded its exit in an atexit function, and then hung in multiprocessing's
    # own (which runs first now): it lived until it was killed, not until its exit record.
    atexit = [e.ts_ns for e in t.of_kind("process.exit") if e.pid == main.pid]
    assert atexit and atexit[0] < kill
    assert main.exit_ns >= kill and worker.exit_ns >= kill
    # the picture: both lanes end at the kill, at the same x (the main one ended at the
    # atexit record before: killed there, seconds early)
    import mpviz.viz as viz
    fig = viz.timeline(t)
    lives = next(c for c in fig.axes[0].collections if c.get_gid() == "lives")
    ends = [path.vertices[:, 0].max() for path in lives.get_paths()]
    assert len(ends) == 2 and abs(ends[0] - ends[1]) < 1.0, ends        # (ms: the axis's unit)


# --- d. a Pool worker that exits holding a job -------------------------------------------------

@pytest.mark.parametrize("how", ["sys", "os"])
def test_a_pool_worker_that_exits_in_its_task_leaves_the_pool_waiting_for_ever(how, tmp_path,
                                                                               fonts_loaded):
    status, err = trace("pool_task_exits.py", how, directory=tmp_path)
    assert status == HANG_STATUS, err
    # (which of the two workers takes the bad number varies from run to run)
    died = re.search(r"pool_task_exits.py's main thread waits: the result of Pool job 0 -- "
                     r"worker (\d) exited \(exit 1\) while running job 0: Pool waits for its "
                     r"result for ever", err)
    assert died and died.group(1) in "01", err
    assert "bpo-22393" in err and "BrokenProcessPool" in err
    # (ProcessPoolExecutor raises BrokenProcessPool for a worker that dies, not for a task's
    # sys.exit(): that comes back as SystemExit and ends the caller, silently, with status 1)
    assert "raises a task's sys.exit() in the caller as SystemExit" in err, err
    # the worker the Pool started in its place (worker 2), and the other one, wait for work
    for idle in {"0", "1", "2"} - {died.group(1)}:
        assert f"worker {idle} is idle, not stuck" in err, err
        # ... and the lines of where each thread is name it so too, beside its process name
        # (ForkPoolWorker-2 is worker 1: the learner could not tell which line was which)
        assert re.search(rf"{POOL_WORKER}-\d \(worker {idle}, pid \d+\), main thread: ", err), err
    # each worker's one thread is its main thread, even the one the Pool's helper thread
    # forked (its stack below the fork is that thread's); none waits at `with Pool(2)`
    workers = re.findall(rf"\({POOL_WORKER}-\d\):\n    (\w+ ?\w*):", err)
    assert len(workers) == 2 and set(workers) == {"main thread"}, err   # (one has exited)
    assert "`with Pool(2) as pool:`" not in err and "pool_task_exits.py:21" not in err, err
    t = load(str(tmp_path))
    from mpviz.trace import analysis as st
    stuck = {d.pid: d.reason for d in st.deadlocks(t)}
    main = next(p.pid for p in t.processes() if p.how == "exec")
    assert list(stuck) == [main], stuck
    assert stuck[main].startswith(f"worker {died.group(1)} exited (exit 1) while running job 0")
    import mpviz.viz as viz
    texts = [a.get_text() for a in viz.timeline(t).axes[0].texts
             if a.get_gid() == "stuck text"]
    assert len(texts) == 1 and "Pool waits for its result for ever" in texts[0], texts
    # the Pool's task queue is empty, but its task handler put tasks there and would put more:
    # the wait-for graph never says "nobody has put into it yet". The workers that wait for
    # their next task are idle, no part of the hang: the graph leaves them out and its title
    # names them idle, so the one chain drawn is the main thread's wait for the dead worker's job
    fig = viz.wait_for(t)
    graph = [a.get_text() for a in fig.axes[0].texts]
    assert not any("nobody has put" in text for text in graph), graph
    assert any("Pool job 0" in text for text in graph), graph
    assert any("exited, status 1" in text for text in graph), graph
    title = fig.axes[0].get_title(loc="left")
    assert "idle, not stuck" in title, title
    for idle in {"0", "1", "2"} - {died.group(1)}:
        assert f"worker {idle}" in title, title
        assert not any(text.startswith(f"worker {idle} ") for text in graph), graph


def test_a_pool_worker_killed_by_a_signal_gets_a_fix_for_a_kill_not_for_an_exit(tmp_path,
                                                                              fonts_loaded):
    # the out-of-memory killer's shape: nothing in the task called sys.exit() or os._exit(),
    # and the verdict told the learner to stop calling them
    status, err = trace("pool_task_killed.py", directory=tmp_path)
    assert status == HANG_STATUS, err
    assert re.search(r"pool_task_killed.py's main thread waits: the result of Pool job 0 -- "
                     r"worker \d was killed \(SIGKILL\) while running job 0: Pool waits for its "
                     r"result for ever", err), err
    assert "bpo-22393" in err and "out-of-memory killer" in err and "BrokenProcessPool" in err
    assert "instead of sys.exit()" not in err, err
    # the wait-for graph's box of that worker says how it ended, as the verdict does (it said
    # only "(ended)", under an arrow "must finish its task")
    import mpviz.viz as viz
    graph = [a.get_text() for a in viz.wait_for(load(str(tmp_path))).axes[0].texts]
    assert any(text.startswith("worker ") and text.endswith("main thread\n(killed by SIGKILL)")
               for text in graph), graph


def test_a_pool_job_lost_to_a_worker_exit_is_told_when_the_program_waits_in_pool_join(tmp_path):
    # apply_async without get(), then close() and join(): no wait on the job's own result, and
    # the verdict said only "worker 0 is idle" -- not why pool.join() never returns
    status, err = trace("pool_tasks_then_join.py", directory=tmp_path)
    assert status == HANG_STATUS, err
    assert re.search(r"worker \d exited \(exit 1\) while running job \d+: Pool waits for its "
                     r"result for ever, and so does whatever waits for all its jobs "
                     r"\(pool.join\(\) after close\(\)\) \(a Pool replaces a worker", err), err
    assert "bpo-22393" in err
    assert "<module> (pool_tasks_then_join.py:19): `pool.join()`" in err


def test_a_pool_ended_by_its_with_block_is_not_said_to_wait_for_the_task_it_killed(tmp_path):
    # terminate() (leaving `with Pool()`) kills a busy worker: its task is gone, and nobody
    # waits for it -- the hang is elsewhere (a join before the get)
    status, err = trace("pool_left_then_join_first.py", directory=tmp_path, hang_after=1.5)
    assert status == HANG_STATUS, err
    assert "HANG AT EXIT: Process-3 has done its work but cannot exit" in err, err
    assert "while running job" not in err and "bpo-22393" not in err, err
    # the program never reads the queue: no "get() that comes after the join" to blame
    assert ("pool_left_then_join_first.py's main thread waits in `join` for Process-3 (at your "
            "line pool_left_then_join_first.py:24 in <module>(): `p.join()`); nothing reads "
            "Queue 1 meanwhile (a get() before the join would empty its pipe)") in err, err
    assert "comes after the join" not in err, err


# --- f. Ctrl-C is a diagnosis ------------------------------------------------------------------

def _wait_until(directory, ready, timeout=30):
    """Poll the trace being written until `ready(trace)` (a deadline, not a sleep to hope)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready(load(directory)):
                return
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"the program did not reach its wait within {timeout} s")


def _session_alive(sid):
    from mpviz.trace.session import session_pids
    return session_pids(sid)


def _ctrl_c_to_the_launcher(directory, program, *args, said, ready):
    """Trace tests/exit_programs/`program`; once it printed `said` and `ready(trace)` holds, a
    Ctrl-C as a terminal sends it (to the launcher's process group); (launcher, stderr)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mpviz", "trace", "--hang-after", "1", "--no-plot", "-o",
         str(directory), "--", sys.executable, os.path.join(PROGRAMS, program), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        start_new_session=True)
    try:
        assert launcher.stdout.readline().strip() == said
        _wait_until(str(directory), ready)
        os.killpg(launcher.pid, signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    return launcher, err


def test_ctrl_c_to_the_launcher_reports_where_everyone_waits_then_stops_the_program(tmp_path):
    # A terminal's Ctrl-C goes to its foreground process group: here, the launcher's own.
    launcher, err = _ctrl_c_to_the_launcher(
        tmp_path, "wait_for_file.py", str(tmp_path / "never-written.txt"),
        said="waiting for the reader", ready=lambda t: any(
            e.kind == "wait.begin" and e.args.get("on") == "process" for e in t.events) and any(
            e.kind == "process.bootstrap" and e.args.get("name") == "reader" for e in t.events))
    assert launcher.returncode == 128 + signal.SIGINT, err
    report = err.index("mpviz trace: INTERRUPTED (Ctrl-C)")
    # each process's stack down to the program's own line, and what each waits for ...
    assert "wait_for_input (wait_for_file.py:14)" in err, err      # the reader, in its sleep
    assert "<module> (wait_for_file.py:22)" in err                 # the main program's join
    assert ("wait_for_file.py's main thread waits: join reader (pid ") in err
    assert "reader's main thread must exit" in err
    # ... said before the program heard the SIGINT (its KeyboardInterrupt comes after)
    assert report < err.index("KeyboardInterrupt")
    assert "passed SIGINT on to the program, which ended with status 130" in err
    program = next(p.pid for p in load(str(tmp_path)).processes() if p.how == "exec")
    assert not _session_alive(program)
    assert "INTERRUPTED (Ctrl-C)" in load(str(tmp_path)).verdict


def test_ctrl_c_to_a_program_that_is_only_busy_says_it_runs_and_invents_no_wait(tmp_path):
    # The report said only its stack, then "the innermost call is where each thread waits":
    # a learner read a wait into a loop that counts.
    launcher, err = _ctrl_c_to_the_launcher(
        tmp_path, "busy_computing.py", said="counting",
        ready=lambda t: any(e.kind == "process.start" for e in t.events))
    assert launcher.returncode == 128 + signal.SIGINT, err
    report = err[err.index("mpviz trace: INTERRUPTED (Ctrl-C)"):err.index("passing SIGINT on")]
    assert "busy_computing.py (pid " in report, report
    assert "), main thread: running (using CPU) -- at <module> (busy_computing.py:" in report
    mine = [line for line in report.splitlines() if line.startswith("  busy_computing.py (pid")]
    assert len(mine) == 1 and "wait" not in mine[0], report
    assert "where each thread waits" not in report, report


@pytest.mark.parametrize("to, method", [("group", None), ("process", None),
                                        ("group", "forkserver")])
def test_interrupting_a_record_block_reports_where_everyone_waits_then_ends_its_processes(
        to, method, tmp_path):
    # Jupyter's "interrupt" sends SIGINT to the kernel's process group: the block's child hears
    # it too (`group`); `kill -INT` reaches the recording process only (`process`). A child of
    # the fork server (3.14's default) took no stacks at a Ctrl-C: the fork server ignores SIGINT
    directory = tmp_path / "trace"
    program = subprocess.Popen(
        [sys.executable, os.path.join(PROGRAMS, "record_interrupted.py"), str(directory),
         *([method] if method else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        start_new_session=True)
    try:
        assert program.stdout.readline().strip() == "waiting for the first result"
        _wait_until(str(directory), lambda t: sum(
            e.kind == "wait.begin" and e.args.get("on") == "queue.get" for e in t.events) == 2)
        children = [p.pid for p in load(str(directory)).processes() if p.pid != program.pid]
        (os.killpg if to == "group" else os.kill)(program.pid, signal.SIGINT)
        _, err = program.communicate(timeout=60)
    finally:
        if program.poll() is None:
            os.killpg(program.pid, signal.SIGKILL)
            program.wait()
    assert program.returncode == -signal.SIGINT, err      # the KeyboardInterrupt went on
    # the report first, then the block's KeyboardInterrupt (the worker, which heard the same
    # SIGINT, may print its own before)
    assert err.index("mpviz: INTERRUPTED (Ctrl-C)") < err.rindex("Traceback")
    assert "(squarer):" in err and "(main):" in err
    assert "square_all (record_interrupted.py:15)" in err            # the worker's own line
    assert "<module> (record_interrupted.py:27)" in err              # the cell's line
    assert "on_interrupt" not in err                                 # not mpviz's handler
    # each waits on the other's queue (numbered in the order their waits began), which nobody
    # has put into
    waits = re.findall(r"(squarer|main)'s main thread waits: get\(\) on (Queue \d): nothing in "
                       r"it yet -- someone must put into \2, and nobody has put into it yet", err)
    assert sorted(who for who, _ in waits) == ["main", "squarer"], err
    assert waits[0][1] != waits[1][1], err
    # (a fork server -- 3.14's default -- leaves when it reads the end of the program's pipe to
    # it, a moment after the program: a bounded poll)
    deadline = time.monotonic() + 10
    while _session_alive(program.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children) == 1 and not _session_alive(program.pid)
    if to == "process":                  # the worker did not hear it: the block ended it
        assert "stopped 1 process(es) started in the block" in err


def test_an_interrupt_report_with_no_process_left_to_ask_says_so_not_empty_headings():
    """A Ctrl-C to the whole group reaches the children first: by the time record() asks, each
    has ended. The report says why it has no stacks (it printed a bare heading before)."""
    import mpviz.trace as mt
    from mpviz.trace import watchdog
    with mt.record() as trace:
        pass
    report = watchdog.interrupt_report(trace, {}, who="record()")
    assert "no process left to ask: the same Ctrl-C reached them all" in report, report
    assert "the trace recorded no wait that was still open" in report, report


def test_a_program_killed_from_outside_is_said_to_be_killed_not_just_counted(tmp_path):
    # kill -9 from another terminal (or the OOM killer): the report said only "N events from M
    # processes", and the exit status 137 was left for the learner to decode
    ready = tmp_path / "pid"
    program = (f"import os, time\nopen({str(ready)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
               f"os.rename({str(ready)!r} + '.tmp', {str(ready)!r})\ntime.sleep(60)\n")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mpviz", "trace", "--hang-after", "0", "--no-plot", "-o",
         str(tmp_path / "t"), "--", sys.executable, "-c", program],
        stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(int(ready.read_text()), signal.SIGKILL)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGKILL, err
    assert re.search(r"the program \(pid \d+\) was killed by a signal, SIGKILL \(9\), which mpviz "
                     r"did not send: exit status 137 \(kill -9 sends it", err), err
    assert "events from 1 process in" in err, err


def test_the_fork_server_and_resource_tracker_are_named_where_each_thread_is(tmp_path):
    # forkserver (3.14's default start method on Linux) starts two helpers that record nothing:
    # the report listed their threads as "? (pid N)"
    status, err = trace("forkserver_never_sent.py", directory=tmp_path)
    assert status == HANG_STATUS, err
    assert re.search(r"\n  Python's fork server \(pid \d+\), main thread: ", err), err
    assert re.search(r"\n  Python's resource tracker \(pid \d+\), main thread: reads a pipe",
                     err), err
    assert "? (pid" not in err, err
    assert re.search(r"ForkServerProcess-1 \(pid \d+\), main thread: reads a (socket|pipe)", err)
