"""Blocking waits are events: a hang is seen as threads that wait, and on what (mpviz.trace.waits).

The two hangs run as real programs under ``python -m mpviz trace``, in a session of their own,
and are killed after their waits were recorded: these tests never hang and leave no process.
"""
import array
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from concurrent import futures
from concurrent.futures import ProcessPoolExecutor

import pytest
from matplotlib.collections import PatchCollection

sys.path.insert(0, os.path.dirname(__file__))
import wait_workers as w  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz.trace import analysis as st  # noqa: E402
from mpviz.viz import timeline, wait_for  # noqa: E402
from mpviz.viz.timeline import _TimeAxis  # noqa: E402

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded():
    """matplotlib keeps a font file open once it has used it: load them before the leak check."""
    import io
    from mpviz.viz.figure import Figure
    fig = Figure()
    fig.add_subplot().set_xlabel("≈ µs → ▸")
    fig.savefig(io.BytesIO(), format="png")


# --- running a hanging program, bounded ---------------------------------------------------------

def _tree(root):
    """{pid: command line} of `root` and every live process below it (the launcher, the
    program it runs in a session of its own, and the program's children)."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            procs[int(pid)] = (int(fields[1]), cmd)
    found, grew = {root: procs[root][1]} if root in procs else {}, True
    while grew:
        grew = False
        for pid, (ppid, cmd) in procs.items():
            if ppid in found and pid not in found:
                found[pid] = cmd
                grew = True
    return found


def _alive(pids):
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def _stop(launcher):
    """SIGKILL every process of the traced program, except multiprocessing's resource tracker:
    once the others are gone it sees its pipe close and removes their named semaphores (as it
    does after any crash), then exits by itself."""
    tree = _tree(launcher.pid)
    for pid, cmd in tree.items():
        if "resource_tracker" not in cmd:
            os.kill(pid, signal.SIGKILL)
    launcher.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.05)                         # the tracker cleaning up: bounded
    for pid in _alive(tree):
        os.kill(pid, signal.SIGKILL)
    assert not _alive(tree), "the traced program left processes behind"


def _trace_hang(tmp_path, program, until):
    """Trace `program` (a name in wait_workers) until `until(trace)` holds or 20 s passed, then
    kill it; the trace read back from its logs."""
    out = tmp_path / "trace"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.path.dirname(__file__))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "mpviz", "trace", "-o", str(out), "--", sys.executable,
         os.path.join(os.path.dirname(__file__), "wait_workers.py"), program],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if out.exists() and any(out.iterdir()) and until(mt.load(out)):
                break
        time.sleep(0.5)                          # it stays stuck: nothing more happens
    finally:
        _stop(launcher)
        launcher.stderr.close()
    return mt.load(out)


def _waits(trace, on):
    begins = [e for e in trace.of_kind("wait.begin") if e.args["on"] == on]
    ends = [e for e in trace.of_kind("wait.end") if e.args["on"] == on]
    return begins, ends


def _open_wait(trace, on):
    return bool([e for e in _waits(trace, on)[0]])


def _trace_hang_after(tmp_path, program, on, ended):
    """Trace `program` until a wait `on` is open and the process named `ended` has ended: the
    trace, and that process."""
    def until(t):
        return _open_wait(t, on) and any(p.name == ended and p.exit_ns for p in t.processes())
    trace = _trace_hang(tmp_path, program, until)
    (proc,) = [p for p in trace.processes() if p.name == ended]
    return trace, proc


def _drawn_blocked(fig):
    """(hatched boxes drawn for blocked waits, the texts of their labels)."""
    ax = fig.axes[0]
    boxes = [c for c in ax.collections
             if isinstance(c, PatchCollection) and c.get_hatch() == "xx"]
    texts = [t.get_text() for t in ax.texts if t.get_text().startswith(("waits:", "waited:"))]
    return boxes, texts


def _never_squeezed(trace, begin):
    """The display span of a wait overlaps no squeezed band of the timeline's time axis."""
    ix = st._index(trace)
    axis = _TimeAxis(trace, ix.t0, max(ix.t1, ix.t0 + 1), True)
    a, b = axis.x(begin.ts_ns), axis.x(ix.t1)
    return all(not (g0 < b and a < g1) for g0, g1, _ in axis.gaps)


# --- the two hangs ------------------------------------------------------------------------------

def test_join_before_get_is_seen_as_waits_that_never_end(tmp_path):
    trace = _trace_hang(tmp_path, "join_before_get",
                        lambda t: _open_wait(t, "process") and _open_wait(t, "pipe.write"))
    (child,) = [p for p in trace.processes() if p.name == "producer"]
    program = child.ppid

    joins, join_ends = _waits(trace, "process")
    assert [(e.pid, e.tid, e.args["id"]) for e in joins] == [(program, program, child.pid)]
    assert join_ends == []                              # the join never returned
    writes, write_ends = _waits(trace, "pipe.write")
    (write,) = writes
    assert write.pid == child.pid and write.tid != child.pid      # the feeder thread
    assert write.args["nbytes"] > w.BIG and write_ends == []
    (put,) = [e for e in trace.of_kind("queue.put") if e.pid == child.pid]
    assert write.args["id"] == put.args["queue"]
    (exit_join,) = _waits(trace, "thread")[0]           # the child, at exit, joins its feeder
    assert (exit_join.pid, exit_join.tid, exit_join.args["id"]) == \
        (child.pid, child.pid, write.tid)

    # the state model: who is blocked, on what, and who must act
    state = st.state_at(trace, st.stuck_moment(trace))
    blocked = {(b.pid, b.tid): b for b in state.blocked}
    assert blocked[(program, program)].on == "process"
    assert blocked[(program, program)].waits_for == ((child.pid, child.pid),)
    assert blocked[(child.pid, child.pid)].waits_for == ((child.pid, write.tid),)
    assert blocked[(child.pid, write.tid)].on == "pipe.write"
    assert blocked[(child.pid, write.tid)].waits_for == ()     # nobody has read it yet
    assert "join producer" in state.text()

    # the picture: the join is a labelled blocked box, and never squeezed as idle
    fig = timeline(trace)
    boxes, texts = _drawn_blocked(fig)
    assert len(boxes) == 1 and len(boxes[0].get_paths()) == 3
    assert any(t.startswith("waits: join producer") for t in texts)
    assert _never_squeezed(trace, joins[0])
    assert "idle" not in fig.axes[0].get_xlabel()

    # the wait-for graph: the queue's full pipe → the feeder → the child's exit → the join
    graph = wait_for(trace)
    words = [t.get_text() for t in graph.axes[0].texts]
    assert {"blocks", "must finish", "must exit"} <= set(words)
    assert any("pipe full: nobody has read it yet" in t for t in words)
    if os.environ.get("MPVIZ_SAVE_PNG"):
        fig.savefig(os.environ["MPVIZ_SAVE_PNG"], dpi=90)
        graph.savefig(os.environ["MPVIZ_SAVE_PNG"].replace(".png", "_wait_for.png"), dpi=90)


def test_missing_task_done_is_seen_as_a_queue_join_that_never_ends(tmp_path):
    trace, consumer = _trace_hang_after(tmp_path, "missing_task_done", "queue.join", "consumer")
    program = consumer.ppid

    joins, ends = _waits(trace, "queue.join")
    assert [(e.pid, e.tid) for e in joins] == [(program, program)] and ends == []
    qid = joins[0].args["id"]
    assert {e.args["queue"] for e in trace.of_kind("queue.put") if e.pid == program} == {qid}

    state = st.state_at(trace)
    (b,) = [b for b in state.blocked if b.pid == program]
    assert b.on == "queue.join" and b.target == qid
    assert b.waits_for == ((consumer.pid, consumer.pid),)   # the one that got the items

    fig = timeline(trace)
    boxes, texts = _drawn_blocked(fig)
    assert boxes and any(t.startswith("waits: q.join()") for t in texts)
    assert _never_squeezed(trace, joins[0])

    graph = wait_for(trace)          # the consumer (ended) must call task_done() → the queue
    words = [t.get_text() for t in graph.axes[0].texts]
    assert "must call task_done()" in words and "blocks" in words
    assert any(t.startswith("consumer") and t.endswith("(ended)") for t in words)
    if os.environ.get("MPVIZ_SAVE_PNG"):
        graph.savefig(os.environ["MPVIZ_SAVE_PNG"].replace(".png", "_task_done.png"), dpi=90)


def test_a_get_that_waits_for_ever_is_a_wait_on_the_producer(tmp_path):
    """The producer ended without its sentinel: the consumer's get on the empty queue is an
    open wait, drawn and named, and the producer (ended) is the one who had to put."""
    trace, producer = _trace_hang_after(tmp_path, "missing_sentinel", "queue.get", "producer")
    program = producer.ppid
    qid = {e.args["queue"] for e in trace.of_kind("queue.put")}.pop()

    gets, ends = _waits(trace, "queue.get")
    open_gets = [g for g in gets if len([e for e in ends if e.tid == g.tid]) <
                 len([b for b in gets if b.tid == g.tid])]
    assert {(g.pid, g.tid, g.args["id"]) for g in gets} == {(program, program, qid)}
    assert len(gets) == len(ends) + 1 and open_gets       # the last get never returned
    assert len(trace.of_kind("queue.get")) == 2           # both items were read

    state = st.state_at(trace)
    (b,) = [b for b in state.blocked if b.pid == program]
    assert b.on == "queue.get" and b.target == qid
    assert b.what == "get() on Queue 1: nothing in it yet"
    assert b.waits_for == ((producer.pid, producer.pid),)     # the one that put into it

    fig = timeline(trace)
    boxes, texts = _drawn_blocked(fig)
    assert any(t.startswith("waits: get() on Queue 1: nothing in it yet") for t in texts)
    assert _never_squeezed(trace, gets[-1])

    graph = wait_for(trace)          # the producer (ended) must put → Queue 1 (empty) → main
    words = [t.get_text() for t in graph.axes[0].texts]
    assert "must put" in words and "blocks" in words
    assert any(t.startswith("Queue 1") and "empty" in t for t in words)
    assert any(t.startswith("producer") and t.endswith("(ended)") for t in words)
    from mpviz.trace import watchdog
    said = "\n".join(watchdog.waits_in_words(trace))
    # (it put its two and ended well: not "must put -- but it has ended", a claim mpviz cannot
    # back -- the same words fit a worker that put all it had and one never started)
    assert "get() on Queue 1: nothing in it yet -- producer's main thread put into it and has " \
        "ended: no thread seen putting into it can put again" in said, said
    if os.environ.get("MPVIZ_SAVE_PNG"):
        fig.savefig(os.environ["MPVIZ_SAVE_PNG"].replace(".png", "_get.png"), dpi=90)
        graph.savefig(os.environ["MPVIZ_SAVE_PNG"].replace(".png", "_get_wait_for.png"), dpi=90)


# --- waits that end: both ends recorded, once each ----------------------------------------------

def _pairs(trace, on):
    """(begin, end) pairs of wait `on`, matched per thread; asserts every begin has its end."""
    begins, ends = _waits(trace, on)
    assert len(begins) == len(ends), (on, begins, ends)
    for b, e in zip(sorted(begins, key=lambda e: (e.pid, e.tid, e.ts_ns)),
                    sorted(ends, key=lambda e: (e.pid, e.tid, e.ts_ns))):
        assert (b.pid, b.tid, b.args["id"]) == (e.pid, e.tid, e.args["id"]) and b.ts_ns <= e.ts_ns
    return list(zip(begins, ends))


def test_waits_that_end_are_recorded_with_both_ends(tmp_path):
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        ev = ctx.Event()
        p = ctx.Process(target=w.set_later, args=(ev,))
        p.start()
        p.join(timeout=0.01)                                    # gives up: ok False
        assert ev.wait(timeout=10)
        p.join()
        assert not ctx.Event().wait(timeout=0.01)               # times out: ok False

        cond = ctx.Condition()
        with cond:
            c = ctx.Process(target=w.notify_later, args=(cond,))
            c.start()
            assert cond.wait(timeout=10)
        c.join()

        sem = ctx.Semaphore(0)
        s = ctx.Process(target=w.release_later, args=(sem,))
        s.start()
        assert sem.acquire(timeout=10)
        s.join()

        b = ctx.Process(target=w.barrier_pair)
        b.start()
        b.join()

        jq = ctx.JoinableQueue()
        f = ctx.Process(target=w.finish_tasks, args=(jq,))
        f.start()
        jq.put(1)
        jq.put(2)
        jq.join()
        f.join()

        with ctx.Pool(1) as pool:
            assert pool.apply_async(w.slow_square, (3,)).get(timeout=10) == 9
            assert pool.map(w.slow_square, [1, 2]) == [1, 4]
        with ProcessPoolExecutor(1, mp_context=ctx) as ex:
            assert ex.submit(w.slow_square, 4).result(timeout=10) == 16
            fs = [ex.submit(w.slow_square, i) for i in range(2)]
            futures.wait(fs)
            assert sorted(x.result() for x in futures.as_completed(
                [ex.submit(w.slow_square, 5)])) == [25]
    me = os.getpid()

    ev_wait, ev_timeout = _pairs(trace, "event")
    assert ev_wait[0].pid == me and ev_wait[1].args["ok"] is True
    assert ev_timeout[0].args["timeout"] == 0.01 and ev_timeout[1].args["ok"] is False
    assert ev_wait[1].ts_ns - ev_wait[0].ts_ns > 50e6          # it really waited (~0.1 s)
    (cond_wait,) = _pairs(trace, "condition")                  # Event.wait's inner one: not
    assert cond_wait[0].pid == me and cond_wait[1].args["ok"] is True    # recorded twice
    barrier_waits = _pairs(trace, "barrier")                    # both sides of the meeting
    assert len(barrier_waits) == 2 and barrier_waits[0][0].args["id"] == \
        barrier_waits[1][0].args["id"] and b.pid in {x[0].pid for x in barrier_waits}
    (qjoin,) = _pairs(trace, "queue.join")
    assert qjoin[0].args["id"] == trace.of_kind("queue.put")[0].args["queue"]
    sem_wait = [e for e in trace.of_kind("lock.wait") if e.args["type"] == "Semaphore"]
    assert len(sem_wait) == 1 and any(e.kind == "lock.acquire" and e.args["lock"] ==
                                      sem_wait[0].args["lock"] for e in trace.events)
    joins = _pairs(trace, "process")
    children = {p.pid for p in (p, c, s, b, f)}
    assert children <= {x[0].args["id"] for x in joins}
    given_up, done = [x[1].args["ok"] for x in joins if x[0].args["id"] == p.pid]
    assert (given_up, done) == (False, True)
    results = _pairs(trace, "pool.result")
    assert len(results) == 2 and all(x[0].pid == me for x in results)   # apply_async, map
    jobs = {e.args["job"] for e in trace.of_kind("pool.task")}
    assert {x[0].args["id"] for x in results} <= jobs
    futs = _pairs(trace, "future")
    assert len(futs) >= 2 and all(x[0].pid == me for x in futs)   # result(), wait(), as_completed
    assert any(str(x[0].args["id"]).startswith("future-") for x in futs)
    assert any(x[0].args["id"] == "2 futures" for x in futs) or all(
        fut.done() for fut in fs)                               # wait() may find them all done
    # the state model has no thread blocked at the end: every wait ended
    assert st.state_at(trace).blocked == ()


def _until_pipe_full(q, timeout=20):
    """Wait until `q`'s pipe is full (what it holds stops growing, at tens of KiB: Linux's pipe
    holds up to 16 pages, fewer bytes when writes fill pages part way): its writer is blocked."""
    import fcntl
    import termios
    deadline, last = time.monotonic() + timeout, -1
    while True:
        held = array.array("i", [0])
        fcntl.ioctl(q._reader.fileno(), termios.FIONREAD, held)
        if held[0] > 32768 and held[0] == last:
            return
        assert time.monotonic() < deadline, f"the producer's pipe holds {held[0]} bytes"
        last = held[0]
        time.sleep(0.05)


def test_a_feeder_blocked_on_a_full_pipe_is_a_wait_on_the_reader(tmp_path):
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        q = ctx.Queue()
        p = ctx.Process(target=w.put_big, args=(q,), name="producer")
        p.start()
        _until_pipe_full(q)       # the feeder blocks: the pipe holds all it can (a busy machine
        time.sleep(0.3)           # may take long to start the child; a fixed sleep was too short)
        assert len(q.get(timeout=10)) == w.BIG
        p.join()
    ((begin, end),) = _pairs(trace, "pipe.write")
    assert begin.pid == p.pid and begin.tid != p.pid and end.args["ok"] is True
    assert end.ts_ns - begin.ts_ns > 100e6                      # blocked until the get
    (get,) = [e for e in trace.of_kind("queue.get") if e.pid == os.getpid()]
    assert get.args["queue"] == begin.args["id"] and get.ts_ns >= end.ts_ns - 50e6
    # at an instant inside the wait, the feeder waits for ... the reader, once it has read
    state = st.state_at(trace, (begin.ts_ns + end.ts_ns) // 2)
    (b,) = [b for b in state.blocked if b.on == "pipe.write"]
    assert b.pid == p.pid and "full pipe" in b.what


@pytest.fixture(params=["C", "Python"])
def writer(request, monkeypatch):
    """Which Writer records (and so which hooks: writer.c's Hook, or messages.py's)."""
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if request.param == "Python" else "0")
    return request.param


def _queues():
    import mpviz.multiprocessing as mmp
    ctx, own = mp.get_context("fork"), mmp.get_context("fork")
    return {"Queue": ctx.Queue, "JoinableQueue": ctx.JoinableQueue,
            "SimpleQueue": ctx.SimpleQueue, "mpviz Queue": own.Queue,
            "mpviz JoinableQueue": own.JoinableQueue}


@pytest.mark.parametrize("kind", list(_queues()))
def test_a_get_on_an_empty_queue_is_a_wait_and_a_get_with_data_is_not(tmp_path, writer, kind):
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        q = _queues()[kind]()
        p = ctx.Process(target=w.put_later, args=(q, (1, 2)))
        p.start()
        assert q.get() == 1                           # empty for ~0.2 s: a wait
        p.join()                                      # a Queue's child flushes its feeder
        assert q.get() == 2                           # before it ends: 2 is in the pipe, no wait
        if kind != "SimpleQueue":                     # a timeout that runs out: ok False
            with pytest.raises(Exception) as raised:
                q.get(timeout=0.05)
            assert type(raised.value).__name__ == "Empty"
    qid = trace.of_kind("queue.put")[0].args["queue"]
    pairs = _pairs(trace, "queue.get")
    assert [(b.pid, b.tid, b.args["id"]) for b, _ in pairs] == \
        [(os.getpid(), os.getpid(), qid)] * (1 if kind == "SimpleQueue" else 2)
    (waited, _), ends = pairs[0], [e for _, e in pairs]
    assert ends[0].args["ok"] is True and ends[0].ts_ns - waited.ts_ns > 100e6
    if kind != "SimpleQueue":
        assert pairs[1][0].args["timeout"] == 0.05
        assert ends[1].args["ok"] is False and ends[1].args["error"] == "Empty"
    # the second get found its message: no wait between the first get's end and the timeout
    gets = sorted(e.ts_ns for e in trace.of_kind("queue.get") if e.pid == os.getpid())
    assert len(gets) == 2 and not [b for b, _ in pairs if gets[0] < b.ts_ns <= gets[1]]
    state = st.state_at(trace, (waited.ts_ns + ends[0].ts_ns) // 2)
    (b,) = [b for b in state.blocked if b.pid == os.getpid()]
    assert b.on == "queue.get" and b.what == "get() on Queue 1: nothing in it yet"


@pytest.mark.parametrize("kind", ["Queue", "JoinableQueue", "mpviz Queue",
                                  "mpviz JoinableQueue"])
def test_a_put_on_a_full_queue_is_a_wait_and_a_put_with_room_is_not(tmp_path, writer, kind):
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        q = _queues()[kind](2)
        q.put(1)
        q.put(2)                                      # room: no wait
        p = ctx.Process(target=w.get_later, args=(q, 3))
        p.start()
        q.put(3)                                      # full for ~0.2 s: a wait
        p.join()
        q.put(4)
        q.put(5)
        with pytest.raises(Exception) as raised:      # full, and a timeout that runs out
            q.put(6, timeout=0.05)
        assert type(raised.value).__name__ == "Full"
        assert (q.get(), q.get()) == (4, 5)           # (leave nothing in the pipe)
    pairs = _pairs(trace, "queue.put")
    qid = trace.of_kind("queue.get")[0].args["queue"]
    assert [(b.pid, b.args["id"], b.args["maxsize"]) for b, _ in pairs] == \
        [(os.getpid(), qid, 2)] * 2
    (waited, end), (timed, gave_up) = pairs
    assert end.args["ok"] is True and end.ts_ns - waited.ts_ns > 100e6
    assert timed.args["timeout"] == 0.05 and gave_up.args["ok"] is False
    state = st.state_at(trace, (waited.ts_ns + end.ts_ns) // 2)
    (b,) = [b for b in state.blocked if b.pid == os.getpid()]
    assert b.what == "put() on Queue 1: it is full (2 items)"
    assert b.waits_for == () or all(pid == p.pid for pid, _ in b.waits_for)
    graph = wait_for(trace, (waited.ts_ns + end.ts_ns) // 2)
    words = [t.get_text() for t in graph.axes[0].texts]
    assert any(t.startswith("Queue 1") and "full" in t for t in words)


def _inside(condition, timeout=20):
    """Until a thread waits on `condition` (a queue.Queue's not_empty or all_tasks_done)."""
    deadline = time.monotonic() + timeout
    while not condition._waiters:
        assert time.monotonic() < deadline, "nobody came to wait"
        time.sleep(0.002)


def test_a_queue_queues_get_and_join_are_waits_and_a_librarys_own_queue_is_not(tmp_path):
    """The stdlib's queue.Queue, between the program's threads: its get() on an empty one and
    its join() are waits, its puts and gets say who puts and who gets (once per thread) --
    put_nowait() included; a library's use of one (logging's QueueHandler and QueueListener)
    is not the program's and records nothing."""
    import logging
    import logging.handlers
    import queue
    import threading
    with mt.record(tmp_path / "t") as trace:
        q, logs = queue.Queue(), queue.Queue()
        listener = logging.handlers.QueueListener(logs, logging.NullHandler())
        listener.start()                  # (its thread waits in logs.get(): logging's code)
        log = logging.getLogger("mpviz-test-queue")
        log.addHandler(logging.handlers.QueueHandler(logs))
        log.warning("into logging's queue")
        # (each helper thread acts 0.3 s after the main thread is inside its wait -- seen on
        # the queue's own Condition -- so that the wait lasts >= 0.3 s on a busy machine too)
        putter = threading.Thread(target=lambda: (_inside(q.not_empty), time.sleep(0.3),
                                                  q.put_nowait("x")), name="putter")
        putter.start()
        assert q.get() == "x"                          # empty for ~0.3 s: a wait
        putter.join()
        q.put(1)
        assert q.get() == 1                            # an item there: no wait
        with pytest.raises(queue.Empty):
            q.get(timeout=0.05)                        # a deadline: no wait for ever
        done = threading.Thread(target=lambda: (_inside(q.all_tasks_done), time.sleep(0.3),
                                                q.task_done(), q.task_done()))
        done.start()
        q.join()                                       # 2 unfinished for ~0.3 s: a wait
        done.join()
        listener.stop()
        log.handlers.clear()
    me = (os.getpid(), threading.get_ident())
    tid = {e.args.get("name"): e.tid for e in trace.of_kind("thread.start")}
    (qid,) = {e.args["id"] for e in trace.of_kind("thread_queue.put")}   # (not logging's)
    assert sorted((e.kind, e.tid) for e in trace.events if e.kind.startswith("thread_queue")) \
        == sorted([("thread_queue.put", tid["putter"]), ("thread_queue.put", os.getpid()),
                   ("thread_queue.get", os.getpid())])
    gets, joins = _pairs(trace, "thread_queue.get"), _pairs(trace, "thread_queue.join")
    assert [(b.pid, b.tid, b.args["id"]) for b, _ in gets + joins] == [(os.getpid(),) * 2 +
                                                                       (qid,)] * 2, me
    for waited, end in gets + joins:
        assert end.args["ok"] is True and end.ts_ns - waited.ts_ns > 200e6
    assert joins[0][0].args["unfinished"] == 2
    (waited, end), = gets
    state = st.state_at(trace, (waited.ts_ns + end.ts_ns) // 2)
    (b,) = [b for b in state.blocked if b.pid == os.getpid()]
    assert b.what == "get() on queue.Queue 1: nothing in it yet"
    assert b.waits_for == ()            # (the putter has not put yet: who will, nobody knows)
    from mpviz.trace.watchdog import _who_must_act
    assert _who_must_act(state, b, trace) == ("someone must put into queue.Queue 1, and no "
                                              "thread has put into it yet")


def test_a_forked_childs_first_put_on_its_copy_of_a_queue_queue_is_its_own(tmp_path):
    """fork copies the queue with the callers it has seen (kept on it): the child's first put
    from the same thread and line is still recorded, as the child's."""
    import queue
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        q = queue.Queue()
        for item in (1, 2):
            if item == 2:
                p = ctx.Process(target=w.put_into_queue_queue, args=(q,))
                p.start()
                p.join()
                assert p.exitcode == 0
            else:
                w.put_into_queue_queue(q)
    puts = [(e.pid, e.args["id"]) for e in trace.of_kind("thread_queue.put")]
    assert [pid for pid, _ in puts] == [os.getpid(), p.pid], puts
    assert len({tq for _, tq in puts}) == 1, puts         # (the same queue, copied)


def test_waits_off_cost_nothing_and_leave_the_stdlib_as_it_was():
    from multiprocessing import pool, queues, synchronize
    before = (synchronize.Event.wait, queues.JoinableQueue.join, pool.ApplyResult.get,
              futures.wait, queues.Queue.__dict__["_finalize_join"])
    with mt.record():
        assert synchronize.Event.wait is not before[0]
    after = (synchronize.Event.wait, queues.JoinableQueue.join, pool.ApplyResult.get,
             futures.wait, queues.Queue.__dict__["_finalize_join"])
    assert after == before


BEHIND_THE_READ_LOCK = """
import multiprocessing as mp, sys, threading, time
import mpviz.trace as mt

q = mp.Queue()
q.put("task")                                # a message waits in the queue's pipe ...
time.sleep(0.2)                              # (the feeder has written it)
with mt.record(sys.argv[1]) as trace:
    q._rlock.acquire()                       # ... and another reader holds the read lock
    got = []
    reader = threading.Thread(target=lambda: got.append(q.get()), name="reader")
    reader.start()
    time.sleep(0.3)
    q._rlock.release()
    reader.join()
begins = [e for e in trace.of_kind("wait.begin")
          if e.args.get("on") == "queue.get" and e.tid != e.pid]
print(got, len(begins))
"""


@pytest.mark.parametrize("writer", ["C", "Python"])
def test_a_get_that_finds_a_message_but_not_the_read_lock_is_a_recorded_wait(tmp_path, writer):
    """Only one reader at a time reads a Queue: a get that finds a message there but another
    reader holding the read lock waits for that lock -- for ever, where that reader was
    killed inside its own get (tests/hang_programs/replace_worker_with_terminate.py). It was
    no recorded wait (only "nothing to read" was), by either Writer."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("MPVIZ_PURE_PYTHON", None)
    if writer == "Python":
        env["MPVIZ_PURE_PYTHON"] = "1"
    if writer == "C":
        from mpviz.trace import native
        if native.load() is None:
            pytest.skip(f"no C Writer here: {native.problem}")
    run = subprocess.run([sys.executable, "-c", BEHIND_THE_READ_LOCK, str(tmp_path / "t")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "['task'] 1", run.stdout
