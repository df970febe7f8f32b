"""A get that waits writes one event fewer: its ``queue.get`` ends the wait (waits.py, top).

The recorder writes ``wait.begin`` and the read's ``queue.get``; the reader (reader.py, ``_Waits``)
writes the ``wait.end`` back in at the queue.get's time. What must not change: every waiting get
is drawn as a wait from its begin to its read; a get that gives up (a timeout) or raises still
ends its wait (the recorder's own wait.end); a process killed inside its get is drawn as still
waiting. And, with either Writer, no wait is recorded inside a get's wait (waits inside waits
are recorded once, the outermost).
"""
import multiprocessing as mp
import os
import signal
import time

import pytest

import mpviz.trace as mt
from mpviz.trace import reader
from mpviz.trace import analysis as st

pytestmark = pytest.mark.timeout(90)
FORK = mp.get_context("fork")


@pytest.fixture(params=["C", "Python"])
def writer(request, monkeypatch):
    """Which Writer records (and so which hooks: queue_hooks.c's, or messages.py's)."""
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if request.param == "Python" else "0")
    return request.param


def _queue(kind):
    import mpviz.multiprocessing as mmp
    return {"Queue": FORK.Queue, "mpviz Queue": mmp.get_context("fork").Queue,
            "SimpleQueue": FORK.SimpleQueue}[kind]()


def _raw(directory, monkeypatch):
    """The events as the recorder wrote them: the reader's _Waits turned off."""
    with monkeypatch.context() as m:
        m.setattr(reader, "_WAIT_KINDS", frozenset(), raising=False)   # (both readers: raw)
        return reader.LogReader(directory).poll(final=True)


def _echo(inbox, outbox, n):
    for _ in range(n):
        outbox.put(inbox.get())


# --- a waiting get's wait ends at its read ------------------------------------------------------

@pytest.mark.parametrize("kind", ["Queue", "mpviz Queue"])
def test_a_ping_pongs_waiting_gets_are_drawn_from_begin_to_their_read(tmp_path, writer, kind,
                                                                       monkeypatch):
    n = 60
    with mt.record(tmp_path / "t") as trace:
        a, b = _queue(kind), _queue(kind)
        p = FORK.Process(target=_echo, args=(a, b, n))
        p.start()
        for i in range(n):
            a.put(i)
            assert b.get() == i
        p.join()
    raw = _raw(tmp_path / "t", monkeypatch)
    begins = [e for e in raw if e[3] == "wait.begin" and e[4]["on"] == "queue.get"]
    assert begins                # most gets of a ping-pong wait (fewer on a loaded machine)
    # what the recorder wrote: no wait.end for a get that got its message
    assert not [e for e in raw if e[3] == "wait.end" and e[4]["on"] == "queue.get"]

    # what is drawn: every waiting get is a wait from its begin to its thread's next queue.get
    # on that queue, in both processes, and none is left open
    gets = {}
    for e in trace.of_kind("queue.get"):
        gets.setdefault((e.pid, e.tid, e.args["queue"]), []).append(e.ts_ns)
    drawn = [(pid, tid, b, end) for pid, tid, b, end in st._index(trace).blocked
             if b.args["on"] == "queue.get"]
    assert len(drawn) == len(begins) and {d[0] for d in drawn} <= {os.getpid(), p.pid}, drawn
    for pid, tid, begin, end in drawn:
        read = min(t for t in gets[(pid, tid, begin.args["id"])] if t >= begin.ts_ns)
        assert end == read, (begin, end, read)
    ends = [e for e in trace.of_kind("wait.end") if e.args["on"] == "queue.get"]
    assert len(ends) == len(begins) and all(e.args["ok"] is True for e in ends)
    assert len([f for f in trace.flows() if f.get is not None]) == 2 * n   # links unchanged


# --- a get that gives up or raises still ends its wait ------------------------------------------

class _Stop(Exception):
    pass


def _raise(signum, frame):
    raise _Stop


@pytest.mark.parametrize("kind", ["Queue", "mpviz Queue", "SimpleQueue"])
def test_a_waiting_get_that_raises_or_times_out_still_ends_its_wait(tmp_path, writer, kind):
    old = signal.signal(signal.SIGALRM, _raise)
    try:
        with mt.record(tmp_path / "t") as trace:
            q = _queue(kind)
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(_Stop):                   # raised inside the waiting get
                q.get()
            if kind != "SimpleQueue":
                with pytest.raises(Exception) as raised:     # a timeout that runs out
                    q.get(timeout=0.05)
                assert type(raised.value).__name__ == "Empty"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    begins = [e for e in trace.of_kind("wait.begin") if e.args["on"] == "queue.get"]
    ends = [e for e in trace.of_kind("wait.end") if e.args["on"] == "queue.get"]
    assert len(begins) == len(ends) == (1 if kind == "SimpleQueue" else 2)
    assert ends[0].args["ok"] is False and ends[0].args["error"] == "_Stop"
    assert ends[0].ts_ns - begins[0].ts_ns > 100e6
    if kind != "SimpleQueue":
        assert ends[1].args["ok"] is False and ends[1].args["error"] == "Empty"
    assert not trace.of_kind("queue.get")
    drawn = [d for d in st._index(trace).blocked if d[2].args["on"] == "queue.get"]
    assert [d[3] for d in drawn] == [e.ts_ns for e in ends]       # ended: not still waiting


# --- killed inside the get: still waiting ---------------------------------------------------------

def _get_once(q):
    q.get()


@pytest.mark.parametrize("kind", ["Queue", "mpviz Queue"])
def test_a_process_killed_inside_its_get_is_drawn_as_still_waiting(tmp_path, writer, kind):
    with mt.record(tmp_path / "t") as trace:
        q = _queue(kind)
        p = FORK.Process(target=_get_once, args=(q,))
        p.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:              # until its wait.begin is written
            time.sleep(0.05)
            trace.refresh()
            if [e for e in trace.of_kind("wait.begin") if e.pid == p.pid]:
                break
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    (begin,) = [e for e in trace.of_kind("wait.begin") if e.pid == p.pid]
    assert begin.args["on"] == "queue.get"
    assert not [e for e in trace.of_kind("wait.end") if e.pid == p.pid]
    (drawn,) = [d for d in st._index(trace).blocked if d[0] == p.pid]
    assert drawn[3] is None                               # no end: waiting when it was killed
    (proc,) = [x for x in trace.processes() if x.pid == p.pid]
    (b,) = [b for b in st.state_at(trace, proc.exit_ns - 1).blocked if b.pid == p.pid]
    assert b.on == "queue.get" and b.what == "get() on Queue 1: nothing in it yet"


# --- no wait inside a get's wait ------------------------------------------------------------------

def _put_later(q, delay):
    time.sleep(delay)
    q.put("late")


@pytest.mark.parametrize("kind", ["Queue", "mpviz Queue"])
def test_no_wait_is_recorded_inside_a_gets_wait(tmp_path, writer, kind):
    """A signal handler runs inside the get that it interrupts, in the same thread: its
    Event.wait, join and get are waits inside the get's wait, not recorded (as inside any
    recorded wait), with the C Writer as with the Python one."""
    ran = []

    def handler(signum, frame):
        ev.wait(0.01)                               # times out: a wait, were it recorded
        other.put(1)
        assert other.get() == 1                     # (may wait for the feeder: a get's wait)
        ran.append(True)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        with mt.record(tmp_path / "t") as trace:
            q, other, ev = _queue(kind), _queue(kind), FORK.Event()
            p = FORK.Process(target=_put_later, args=(q, 0.6))
            p.start()
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            assert q.get() == "late"
            p.join()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert ran
    mine = [e for e in trace.events if e.pid == os.getpid()]
    (got,) = [e for e in mine if e.kind == "queue.get" and e.args["queue"] == q._mpviz_qid]
    mine = [e for e in mine if e.ts_ns <= got.ts_ns]          # (p.join() comes after)
    begins = [e for e in mine if e.kind == "wait.begin"]
    assert [(e.args["on"], e.args["id"]) for e in begins] == [("queue.get", q._mpviz_qid)]
    ends = [e for e in mine if e.kind == "wait.end"]
    assert len(ends) == 1 and ends[0].args["ok"] is True
    assert ends[0].ts_ns == got.ts_ns and ends[0].ts_ns - begins[0].ts_ns > 300e6


# --- the reader's part, on events as written ----------------------------------------------------

def _through_waits(events):
    """`events` ((tid, kind, args), in order, ts = their index) as the reader's _Waits passes
    them on."""
    waits, out = reader._Waits(), []
    for ts, (tid, kind, args) in enumerate(events):
        waits.add(out, ts, 1, tid, kind, args)
    return [(ts, tid, kind, args) for ts, _, tid, kind, args in out]


def test_the_reader_ends_a_gets_wait_once_at_its_own_read():
    """A get's wait ends at its thread's queue.get on its queue, not at another queue's or
    another thread's; a wait.end the recorder wrote as well (a trace from before it left that
    out) is dropped, so the wait does not end twice; a timed-out get's own wait.end passes."""
    begin = {"on": "queue.get", "id": "Q1"}
    out = _through_waits([
        (7, "wait.begin", begin),
        (8, "queue.get", {"queue": "Q1"}),                   # another thread's read
        (7, "queue.get", {"queue": "Q2"}),                   # another queue's read
        (7, "queue.get", {"queue": "Q1"}),                   # its read: the wait's end
        (7, "wait.end", {"on": "queue.get", "id": "Q1", "ok": True}),   # an older recorder's
        (7, "wait.begin", begin),
        (7, "wait.end", {"on": "queue.get", "id": "Q1", "ok": False, "error": "Empty"}),
    ])
    ends = [(ts, tid, args["ok"]) for ts, tid, kind, args in out if kind == "wait.end"]
    assert ends == [(3, 7, True), (6, 7, False)]
    assert len(out) == 7                                     # 7 in, 1 written back, 1 dropped
