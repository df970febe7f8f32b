"""A learner's words (issue 27): no internal id in what a person reads, and no frame of
mpviz's own in a traceback or in a verdict's stacks.

The programs are the classic ones a learner writes (two locks taken in opposite orders, a get
from a queue nobody puts into, a join before the get, a Pool) plus one whose calls raise in
every way a traceback gets printed; all run as a user runs them, under
``python -m mpviz trace``, started at once by the first test that needs them.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import mpviz.trace as mt
import mpviz.viz as viz
from mpviz.trace.names import is_arguments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACE_DIR = os.path.join(ROOT, "mpviz", "trace")
OURS = sorted(f for f in os.listdir(TRACE_DIR) if f.endswith(".py"))
# the recorder's ids: a semaphore's, an mpviz queue's, a Connection's, a Pipe end's (conn-),
# a threading lock's
INTERNAL_ID = re.compile(r"sem-[0-9a-f]{6,}|\bmp-[a-z0-9]{6,}|pipe-\d+-\d+|\bconn-\d+|"
                         r"\bt\d+\.\d+\b|0x[0-9a-f]{6,}|\b[0-9a-f]{12,}\b")
SETUP_TIMEOUT = 180

TWO_LOCKS = textwrap.dedent("""
    import multiprocessing as mp
    import time

    def transfer(first, second):
        with first:
            time.sleep(0.3)
            with second:
                pass

    if __name__ == "__main__":
        a, b = mp.Lock(), mp.Lock()
        p = mp.Process(target=transfer, args=(a, b))
        q = mp.Process(target=transfer, args=(b, a))
        p.start(); q.start(); p.join(); q.join()
""")

NOBODY_PUTS = textwrap.dedent("""
    import multiprocessing as mp

    def echo(requests, replies):
        replies.put(requests.get())

    if __name__ == "__main__":
        requests, replies = mp.Queue(), mp.Queue()
        p = mp.Process(target=echo, args=(requests, replies))
        p.start()
        print(replies.get())
        p.join()
""")

JOIN_BEFORE_GET = textwrap.dedent("""
    import multiprocessing as mp

    def produce(q):
        q.put(b"x" * 200_000)

    if __name__ == "__main__":
        q = mp.Queue()
        p = mp.Process(target=produce, args=(q,))
        p.start()
        p.join()
        print(len(q.get()))
""")

POOL = textwrap.dedent("""
    import multiprocessing as mp

    def square(x):
        return x * x

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            print(sum(pool.map(square, range(20))))
""")

# bpo-22393's shape with an initializer (a sharedctypes counter, under spawn): the task's worker
# exits, the Pool waits for its result for ever, the other worker and the replacement wait for a
# task -- having read nothing but their pickled arguments
POOL_WORKER_EXITS = textwrap.dedent("""
    import multiprocessing as mp
    import sys

    counter = None

    def init(shared):
        global counter
        counter = shared

    def task(n):
        with counter.get_lock():
            counter.value += 1
        if n == 0:
            sys.exit(1)                   # gives up on a bad item
        return n * n

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        shared = mp.Value("i", 0)
        with mp.Pool(2, initializer=init, initargs=(shared,)) as pool:
            print(pool.map(task, [0]))
""")

# one job for two workers, on a SimpleQueue: the worker that finds none waits for ever
ONE_JOB = textwrap.dedent("""
    import multiprocessing as mp

    def work(jobs, done):
        job = jobs.get()
        with done.get_lock():
            done.value += job

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        jobs = mp.SimpleQueue()
        done = mp.Value("i", 0)
        jobs.put(1)
        workers = [mp.Process(target=work, args=(jobs, done)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print(done.value)
""")

RAISES = textwrap.dedent("""
    import multiprocessing as mp
    import queue
    import threading
    import traceback

    def divide(x):
        return 1 / x

    def worker(q):
        q.get(timeout=0.1)             # Empty in a child: printed by Process._bootstrap

    if __name__ == "__main__":
        q = mp.Queue()
        try:
            q.get(timeout=0.1)         # Empty, printed by the program
        except queue.Empty:
            traceback.print_exc()
        p = mp.Process(target=worker, args=(q,))
        p.start()
        p.join()
        t = threading.Thread(target=q.get, kwargs={"timeout": 0.1})   # threading.excepthook
        t.start()
        t.join()
        with mp.Pool(1) as pool:
            try:
                pool.map(divide, [0])  # the worker's traceback, re-raised here
            except ZeroDivisionError:
                traceback.print_exc()
        q.get(timeout=0.1)             # uncaught: sys.excepthook
""")


@pytest.fixture(autouse=True)
def _fonts(fonts_loaded):
    """(see conftest.fonts_loaded: the pictures' fonts stay open once loaded)"""


def _start(tmp, name, source, *options):
    (tmp / name).write_text(source)
    return subprocess.Popen(
        [sys.executable, "-m", "mpviz", "trace", "-o", str(tmp / "trace"), *options, "--",
         sys.executable, name], cwd=tmp, env=dict(os.environ, PYTHONPATH=ROOT),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (trace directory, the launcher's stderr)}, every program run at once."""
    programs = {"two locks": (TWO_LOCKS, "--hang-after", "2"),
                "nobody puts": (NOBODY_PUTS, "--hang-after", "2"),
                "join before get": (JOIN_BEFORE_GET, "--hang-after", "2"),
                "pool": (POOL,),
                "pool worker exits": (POOL_WORKER_EXITS, "--hang-after", "2"),
                "one job": (ONE_JOB, "--hang-after", "2"),
                "raises": (RAISES,)}
    started = {}
    for name, (source, *options) in programs.items():
        tmp = tmp_path_factory.mktemp(name.replace(" ", "_"))
        started[name] = (tmp, _start(tmp, name.replace(" ", "_") + ".py", source,
                                     "--no-plot", *options))
    out = {}
    for name, (tmp, proc) in started.items():
        try:
            _, err = proc.communicate(timeout=SETUP_TIMEOUT - 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        out[name] = (tmp / "trace", err)
    return out


def _texts(directory):
    """Everything a person reads about a run: {where: text}."""
    from matplotlib.text import Text
    trace = mt.load(directory)
    texts = {"verdict": trace.verdict or "", "summary": viz.summary(trace),
             "state": viz.state_at(trace, viz.stuck_moment(trace)).text()}
    for name, draw in (("timeline", viz.timeline), ("wait-for graph", viz.wait_for),
                       ("memory map", viz.memory_map), ("plot", viz.plot)):
        texts[name] = "\n".join(t.get_text() for t in draw(trace).findobj(Text))
    with open(os.path.join(directory, "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    texts["trace.json names"] = "\n".join(str(e.get("name")) for e in events)
    return texts


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("name", ["two locks", "nobody puts", "join before get", "pool"])
def test_no_internal_id_in_a_verdict_summary_picture_or_trace_json(runs, name):
    directory, err = runs[name]
    texts = _texts(directory)
    texts["the launcher's report"] = err
    found = {where: sorted(set(INTERNAL_ID.findall(text))) for where, text in texts.items()}
    assert not {w: ids for w, ids in found.items() if ids}, found
    if name == "two locks":
        assert "waits for Lock 1, held by" in err and "waits for Lock 2, held by" in err
        assert err.count("STUCK FOR GOOD: a cycle") == 1, err     # (it was said twice)
        assert "hold Lock 1" in texts["trace.json names"]
    elif name == "nobody puts":
        assert "someone must put into Queue 1, and nobody has put into it yet" in err
        assert "someone must put into Queue 2, and nobody has put into it yet" in err
    elif name == "join before get":
        assert "write 195 KiB into the full pipe of Queue 1 -- someone must read Queue 1" in err
    else:
        names = set(viz.channel_names(mt.load(directory)).values())
        assert {"the Pool's task queue", "the Pool's result queue"} <= names
        assert "get the Pool's result queue" in texts["trace.json names"]


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("name", ["pool worker exits", "one job"])
def test_the_semaphores_of_a_killed_program_are_said_removed_by_its_tracker_not_leaked(runs,
                                                                                       name):
    # spawn (and forkserver, 3.14's default) registers each lock's semaphore with Python's
    # resource tracker, which outlives the processes mpviz kills at a hang and unlinks what they
    # held: its "leaked semaphore objects {'/mp-...'}" warning blamed the program for mpviz's kill
    directory, err = runs[name]
    assert "leaked" not in err and "resource_tracker" not in err, err
    said = re.search(r"\nmpviz trace: after the kill, Python's resource tracker removed the (\d+) "
                     r"semaphore\(s\) \(under the program's locks and queues\) that the killed "
                     r"processes held, as it does after any kill\n", err)
    assert said and int(said[1]) >= 3, err        # a Value's lock, a SimpleQueue's two at least
    assert said[0].strip() in mt.load(directory).verdict
    left = [f.name for f in (directory / ".stacks").iterdir() if not f.name[:-4].isdigit()]
    assert not left, left                         # (the notes read and removed: stacks only)


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("name", ["two locks", "join before get"])
def test_no_mpviz_frame_in_the_stacks_of_a_verdict(runs, name):
    directory, err = runs[name]
    verdict = mt.load(directory).verdict
    assert "Where each process was" in verdict
    frames = re.findall(r"\(([\w.]+\.py):\d+\)", verdict)
    assert frames and name.replace(" ", "_") + ".py" in frames
    assert not [f for f in frames if f in OURS and f != name.replace(" ", "_") + ".py"], verdict


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_no_mpviz_frame_in_a_users_traceback(runs):
    directory, err = runs["raises"]
    assert TRACE_DIR not in err, err
    # every traceback is still there, with the user's lines and the stdlib's raise
    assert err.count("Traceback (most recent call last):") == 6, err
    assert err.count("_queue.Empty") == 4 and "ZeroDivisionError: division by zero" in err
    lines = RAISES.splitlines()
    for code, where in (("q.get(timeout=0.1)         # Empty, printed", "<module>"),
                        ("q.get(timeout=0.1)             # Empty in a child", "worker"),
                        ("return 1 / x", "divide"), ("pool.map(divide", "<module>"),
                        ("q.get(timeout=0.1)             # uncaught", "<module>")):
        number = next(i for i, line in enumerate(lines, 1) if code in line)
        assert f"raises.py\", line {number}, in {where}" in err, (code, err)


def test_an_error_raised_in_mpvizs_own_code_keeps_that_frame_in_the_printed_traceback():
    # a bug of ours (or our clear error about bad input) must point at us: here record()'s
    # check of hang_after, in watchdog.py, called from trace.py's record (hidden: a frame of
    # ours the error only passed through)
    import traceback

    from mpviz.trace import frames
    with pytest.raises(ValueError, match="hang_after must be a number of seconds") as info:
        with mt.record(hang_after="soon"):
            pass
    shown = traceback.extract_tb(frames.without_ours(info.value.__traceback__))
    files = [os.path.basename(f.filename) for f in shown]
    assert files[0] == os.path.basename(__file__) and files[-1] == "watchdog.py", files
    assert shown[-1].name == "check_hang_after" and "trace.py" not in files, files


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_pool_worker_that_waits_for_its_first_task_waits_on_the_pools_task_queue(runs):
    # not on "the arguments of pid N": the one message it had read was its arguments, in
    # _bootstrap, which no get() reads; and the Pool's task thread is who must put
    from mpviz.trace import analysis as st
    directory, err = runs["pool worker exits"]
    trace = mt.load(directory)
    assert re.search(r"worker \d exited \(exit 1\) while running job 0", trace.verdict), \
        trace.verdict
    ix = st._index(trace)
    workers = {p.pid for p in trace.processes() if "PoolWorker" in (p.name or "")}
    assert len([f for f in ix.flows if is_arguments(f.channel)]) == len(workers) == 3
    tasked = {e.pid for e in trace.of_kind("pool.task")}
    waits = [(b, ix.wait_words(b)) for _, _, b, _ in ix.blocked
             if b.pid in workers and b.args.get("on") == "queue.get"]
    assert len(waits) == 2 and not {b.pid for b, _ in waits} & tasked, waits
    assert {w for _, w in waits} == {"get() on the Pool's task queue: nothing in it yet"}, waits
    for b, _ in waits:
        (who,) = ix.must_act(b, trace.events[-1].ts_ns)
        assert "_handle_tasks" in ix.thread_name(*who)
    picture = "\n".join(t.get_text() for t in viz.timeline(trace).axes[0].texts)
    assert "arguments" not in picture, picture


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_who_must_put_into_a_simple_queue_is_named_once(runs):
    directory, err = runs["one job"]
    lines = [line for line in err.splitlines() if "waits: get() on Queue 1" in line]
    assert len(lines) == 1, err
    (line,) = lines
    assert line.endswith("-- one_job.py's main thread must put"), line
