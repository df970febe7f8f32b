"""What a recorded block that ends well lost without a word (analysis.lost_work): record() prints
it under the cell and keeps it as ``trace.lost_work``, ``summary`` says it, and ``mpviz trace``
keeps it beside the logs (``load(DIR).lost_work``). Each program is written as a notebook's cell
would be -- and where the program saw the error (a .get() that raised inside try, an
error_callback, a done callback reading .exception()), nothing is said: a line that cried wolf
at every handled error would teach a learner to skip it."""
import multiprocessing
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

import mpviz.trace
import mpviz.viz as viz

import lost_work_workers as lw

METHODS = ["fork", "spawn", "forkserver"]
MISSING = ["missing_a.txt", "missing_b.txt"]


def lost_lines(capsys):
    """The lines record() printed at the end of the block."""
    return [line for line in capsys.readouterr().err.splitlines()
            if line.startswith("mpviz.trace.record: ")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
def test_pool_errors_nobody_saw_are_said_at_the_end_of_the_block(method, tmp_path, capsys):
    os.chdir(tmp_path)
    ctx = multiprocessing.get_context(method)
    with mpviz.trace.record() as trace:
        with ctx.Pool(2) as pool:
            results = [pool.apply_async(lw.parse, (path,)) for path in MISSING]
            pool.close()
            pool.join()
    said = lost_lines(capsys)
    assert len(said) == 1 and trace.lost_work == [said[0][len("mpviz.trace.record: "):]], said
    assert ("2 Pool tasks raised, and the recorded block ended without an error: parse (job "
            in said[0]), said
    assert ("No such file or directory: 'missing_b.txt' -- and the program never saw these "
            "errors: no .get() of their results raised them, and no error_callback was given."
            ) in said[0], said
    assert f"LOST: {trace.lost_work[0]}" in viz.summary(trace)
    assert all(not r.successful() for r in results)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["get in try", "error_callback", "imap in try", "map in try"])
def test_pool_errors_the_program_saw_are_not_lost(how, tmp_path, capsys):
    os.chdir(tmp_path)
    ctx = multiprocessing.get_context("fork")
    failures = []
    with mpviz.trace.record() as trace:
        with ctx.Pool(2) as pool:
            if how == "get in try":
                for res in [pool.apply_async(lw.parse, (path,)) for path in MISSING]:
                    try:
                        res.get()
                    except FileNotFoundError as exc:
                        failures.append(exc)
            elif how == "error_callback":
                for path in MISSING:
                    pool.apply_async(lw.parse, (path,), error_callback=failures.append)
                pool.close()
                pool.join()
            elif how == "imap in try":
                try:
                    for n in pool.imap(lw.parse, MISSING):
                        print(n)
                except FileNotFoundError as exc:
                    failures.append(exc)
            else:
                try:
                    pool.map(lw.parse, MISSING)
                except FileNotFoundError as exc:
                    failures.append(exc)
    assert failures, how
    assert lost_lines(capsys) == [] and trace.lost_work == [], how
    assert "LOST" not in viz.summary(trace)


@pytest.mark.timeout(60)
def test_executor_errors_are_said_unless_a_done_callback_read_them(tmp_path, capsys):
    os.chdir(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    with mpviz.trace.record() as trace:
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            for path in MISSING:
                ex.submit(lw.parse, path)
    said = lost_lines(capsys)
    assert len(said) == 1 and said[0].startswith(
        "mpviz.trace.record: 2 ProcessPoolExecutor tasks raised, and the recorded block ended "
        "without an error: parse raised FileNotFoundError"), said
    assert "no .result() of their futures raised them, and no .exception() returned them" in \
        said[0], said
    seen = []
    with mpviz.trace.record() as trace:
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            for path in MISSING:
                ex.submit(lw.parse, path).add_done_callback(lambda f: seen.append(f.exception()))
    assert len(seen) == 2 and lost_lines(capsys) == [] and trace.lost_work == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
def test_a_message_the_feeder_dropped_is_said_and_a_failed_block_says_nothing(
        method, tmp_path, capsys):
    ctx = multiprocessing.get_context(method)
    with mpviz.trace.record() as trace:
        q = ctx.Queue()
        worker = ctx.Process(target=lw.take_until_none, args=(q,))
        worker.start()
        with open(tmp_path / "log.txt", "w") as log:
            q.put(("resize", "a.png", log))     # the open log file cannot be pickled
            q.put(None)
            worker.join()
    said = lost_lines(capsys)
    assert len(said) == 1 and re.search(
        r"^mpviz\.trace\.record: \S+ \(pid \d+\) put 1 message into Queue 1 that never reached "
        r"it: the feeder thread could not pickle it \(TypeError: cannot pickle "
        r"'_io\.TextIOWrapper' object\) and dropped it", said[0]), said
    assert trace.lost_work and trace.lost_work[0] in said[0]
    with pytest.raises(RuntimeError):                     # the block's own error is the story
        with mpviz.trace.record() as trace:
            q = ctx.Queue()
            q.put(lambda: 1)
            q.put(None)
            q.get()
            raise RuntimeError("the block failed")
    assert lost_lines(capsys) == [] and trace.lost_work == []


@pytest.mark.timeout(60)
def test_mpviz_trace_keeps_the_lines_for_load(tmp_path):
    """`mpviz trace` prints them at the program's end and keeps them beside the logs."""
    program = tmp_path / "parse_files.py"
    program.write_text(
        "from multiprocessing import Pool\n"
        "from lost_work_workers import parse\n"
        "if __name__ == '__main__':\n"
        "    with Pool(2) as pool:\n"
        "        for path in ['missing_a.txt', 'missing_b.txt']:\n"
        "            pool.apply_async(parse, (path,))\n"
        "        pool.close()\n"
        "        pool.join()\n"
        "    print('all files parsed')\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(lw.__file__))
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", str(out),
                          sys.executable, str(program)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=50)
    assert run.returncode == 0 and "all files parsed" in run.stdout, run.stderr
    loaded = mpviz.trace.load(out)
    assert len(loaded.lost_work) == 1 and loaded.lost_work[0] in run.stderr, run.stderr
    assert loaded.lost_work[0].startswith("2 Pool tasks raised, and the program ended with "
                                          "status 0"), loaded.lost_work
    assert f"LOST: {loaded.lost_work[0]}" in viz.summary(loaded)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
def test_a_pool_terminated_with_a_job_unfinished_is_recorded_and_one_finished_is_not(method):
    """``pool.terminate``: the end of a `with Pool(...)` block while a job runs drops it (the
    verdict of a get() after it says so: test_hang_authors_programs); a block that got its
    results first drops nothing, and records nothing."""
    ctx = multiprocessing.get_context(method)
    with mpviz.trace.record() as trace:
        with ctx.Pool(2) as pool:
            done = pool.map_async(lw.slow_square, range(4))
            assert done.get() == [0, 1, 4, 9]
        with ctx.Pool(2) as pool:
            dropped = pool.map_async(lw.slow_square, range(4))
    ends = trace.of_kind("pool.terminate")
    assert [(e.args["jobs"], e.args["how"]) for e in ends] == [([dropped._job], "with")], ends
    assert ends[0].args["at"].startswith("test_a_pool_terminated_with_a_job_unfinished_is_"
                                         "recorded_and_one_finished_is_not (test_lost_work.py:")
    assert not dropped.ready()


PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lost_work_programs")


def traced(tmp_path, name):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", str(out),
                          sys.executable, os.path.join(PROGRAMS, name)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=100)
    assert run.returncode == 0 and "collected" in run.stdout, run.stderr
    return run, mpviz.trace.load(out)


@pytest.mark.timeout(120)
def test_messages_left_in_a_queue_at_the_end_are_said_with_the_empty_call_that_stopped_early(
        tmp_path):
    """`while not results.empty(): results.get()` stops as soon as the queue is empty for a
    moment, before the workers have put the rest: the program printed "collected 14 squares"
    and mpviz said nothing ("144 events from 5 processes"). The messages left are lost work,
    and the line that stopped is named (``queue.empty``, recorded once per line)."""
    run, loaded = traced(tmp_path, "squares_until_empty.py")
    got = int(re.search(r"collected (\d+) squares", run.stdout).group(1))
    assert got < 40, run.stdout          # (the program's own race: its workers take ~1 s)
    line = next((line for line in loaded.lost_work if "never got" in line), None)
    assert line is not None, loaded.lost_work
    assert re.fullmatch(
        rf"{40 - got} of the 40 messages put into Queue 1 \(by Process-\d, Process-\d, "
        r"Process-\d and Process-\d\) were never got: the program ended with them unread, and "
        r"nothing was raised\. squares_until_empty\.py called empty\(\) on Queue 1, and it "
        r"said True \(<module> \(squares_until_empty\.py:19\): `while not results\.empty\(\):`"
        r"\): empty\(\) says only that nothing is there at that moment -- the others may still "
        r"be putting\. Fix: if they were meant to be got, get a known number of messages "
        r"\(`for _ in range\(n\): q\.get\(\)`\), or until each producer's sentinel \(`None`\) "
        r"has come -- not until empty\(\) says True\.", line), line
    assert f"mpviz trace: {line}" in run.stderr
    assert f"LOST: {line}" in viz.summary(loaded)
    assert len([e for e in loaded.events if e.kind == "queue.empty"]) == 1   # once per line


@pytest.mark.timeout(120)
def test_a_program_that_gets_every_message_loses_nothing(tmp_path):
    """The same workers, the results got by count (its empty() polls said True too: not a
    loss where every message was got)."""
    run, loaded = traced(tmp_path, "squares_counted.py")
    assert "collected 40 squares" in run.stdout
    assert loaded.lost_work == [], loaded.lost_work
    assert "never got" not in run.stderr


@pytest.mark.timeout(120)
def test_a_record_block_says_nothing_of_messages_still_in_its_queue(tmp_path, capsys):
    """A notebook's Queue outlives the block: the next cell may get what is in it."""
    q = multiprocessing.get_context("fork").Queue()
    with mpviz.trace.record(str(tmp_path / "rec"), hang_after=None) as trace:
        q.put("for the next cell")
        q.put("and this")
    assert trace.lost_work == [], trace.lost_work
    assert q.get(timeout=10) == "for the next cell" and q.get(timeout=10) == "and this"
    q.close()
    q.join_thread()


@pytest.mark.timeout(120)
def test_a_daemon_child_terminated_at_exit_mid_work_is_said(tmp_path):
    """`Process(target=write_report, daemon=True).start()` and the program ends: at exit,
    multiprocessing terminates every daemon child still running -- the report is never
    written, and mpviz said "12 events from 2 processes"."""
    report = tmp_path / "report.txt"
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", str(out),
                          sys.executable, os.path.join(PROGRAMS, "report_in_daemon.py"),
                          str(report)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=100)
    assert run.returncode == 0 and not report.exists(), run.stderr
    lost = mpviz.trace.load(out).lost_work
    assert len(lost) == 1, lost
    line = lost[0]
    assert re.fullmatch(                 # (a busy machine may end it before it began to run)
        r"Process-1 \(write_report\) (was still running|had not begun to run its function yet) "
        r"when report_in_daemon\.py ended, not waiting for work: it was a daemon process, and "
        r"at exit multiprocessing terminates every daemon process still running \(SIGTERM\) -- "
        r"what it had left to do \(a file to write, a result to put\) was never done, and "
        r"nothing was raised\. Fix, if it had work to finish: join\(\) it before the program "
        r"ends \(a process that must finish its work is no daemon: the program then waits for "
        r"it at exit\)\.", line), line
    assert f"mpviz trace: {line}" in run.stderr


@pytest.mark.timeout(120)
def test_a_pool_and_a_manager_ended_by_the_interpreters_exit_lose_nothing(tmp_path):
    """Their processes are terminated at exit too (a Pool's workers, idle; a Manager's server):
    the library's own end, not lost work. And the Pool garbage-collected at the interpreter's
    end puts into its change notifier: mpviz wrapped that message in its envelope, which could
    no longer be pickled then -- "Exception ignored in: <function Pool.__del__ ...>
    PicklingError: Can't pickle <function _open ...>" on a program that prints none."""
    run, loaded = traced(tmp_path, "squares_pool_not_closed.py")
    assert loaded.lost_work == [], loaded.lost_work
    assert "Exception ignored" not in run.stderr and "PicklingError" not in run.stderr, \
        run.stderr


@pytest.mark.timeout(120)
def test_a_daemon_server_waiting_for_its_next_request_at_exit_is_no_loss(tmp_path):
    """What daemon=True is for: a helper that serves until the program ends. Terminated while
    it waits in get() for the next line to log, it lost nothing."""
    run, loaded = traced(tmp_path, "log_server_daemon.py")
    assert "LOG: started" in run.stdout
    assert loaded.lost_work == [], loaded.lost_work


@pytest.mark.timeout(120)
def test_items_a_daemon_thread_never_got_from_a_queue_queue_are_said(tmp_path):
    """A daemon thread resizes what the main thread queues in a queue.Queue; the main thread
    queues 20 and ends, without `jobs.join()`: the thread is stopped with the interpreter and
    19 images are never resized -- mpviz said "8 events from 1 process". The queue is looked at
    in the program's atexit (``thread_queue.left``)."""
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", str(out),
                          sys.executable, os.path.join(PROGRAMS, "resize_in_daemon_thread.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=100)
    assert run.returncode == 0 and "queued 20 images" in run.stdout, run.stderr
    lost = mpviz.trace.load(out).lost_work
    assert len(lost) == 1, lost
    assert re.fullmatch(                 # (a busy machine: the thread may not have run yet)
        r"queue\.Queue 1 still held (1\d|20) items when resize_in_daemon_thread\.py ended: "
        r"(Thread-1 \(resizer\), which got from it, is a daemon thread: stopped with the "
        r"interpreter, mid-queue|no thread had got from it yet -- Thread-1 \(resizer\), a "
        r"daemon thread, stopped with the interpreter) -- they were never handled, and nothing was raised\. Fix: wait "
        r"for the queue before the program ends -- `q\.join\(\)`, with a `q\.task_done\(\)` "
        r"after each `get\(\)` -- or give the thread a sentinel to stop at \(`q\.put\(None\)`\) "
        r"and join it \(a thread that must finish its work is no daemon\)\.", lost[0]), lost


@pytest.mark.timeout(120)
def test_a_queue_queue_waited_for_with_join_loses_nothing(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o", str(out),
                          sys.executable, os.path.join(PROGRAMS, "resize_and_join_queue.py")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=100)
    assert run.returncode == 0 and "resized 20 images" in run.stdout, run.stderr
    assert mpviz.trace.load(out).lost_work == []
