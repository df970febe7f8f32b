"""A Queue's puts and gets linked by pipe order (no envelope), checked against marks.

Each producer marks ``("put", tag, i)`` right before its put and each consumer ``("got", tag, i)``
right after its get; a flow is right when the mark before its put and the mark after its get name
the same message.
"""
import multiprocessing
import os
import random

import pytest

import mpviz.multiprocessing as mp
import mpviz.trace as mt
from mpviz.trace import messages
from mpviz.trace.events import Event, order

import trace_workers as tw
from proc_helpers import finish, start

pytestmark = pytest.mark.timeout(90)

SIZES = [8, 100, 70_000, 8, 8, 3_000, 150_000, 8, 40, 8]   # two never fit in the pipe


def _mark_before(trace, event, name):
    marks = [e for e in trace.events if e.kind == "mark" and e.args["name"] == name
             and e.pid == event.pid and e.ts_ns <= event.ts_ns]
    return (marks[-1].args["tag"], marks[-1].args["i"]) if marks else None


def _mark_after(trace, event, name):
    marks = [e for e in trace.events if e.kind == "mark" and e.args["name"] == name
             and e.pid == event.pid and e.tid == event.tid and e.ts_ns >= event.ts_ns]
    return (marks[0].args["tag"], marks[0].args["i"]) if marks else None


@pytest.mark.parametrize("library", ["mpviz", "stdlib"])
def test_every_put_links_to_the_get_that_read_it(start_method, library):
    ctx = (mp if library == "mpviz" else multiprocessing).get_context(start_method)
    with mt.record() as trace:
        q, done = ctx.Queue(), ctx.Queue()
        producers = [start(ctx, tw.produce, q, tag, SIZES) for tag in "ab"]
        consumers = [start(ctx, tw.consume, q, done) for _ in range(2)]
        finish(*producers)
        for _ in consumers:
            q.put(None)                                       # one end marker each
        counts = [done.get(timeout=60) for _ in consumers]
        finish(*consumers)
    assert sum(counts) == 2 * len(SIZES)
    flows = [f for f in trace.flows() if f.put.pid in {p.pid for p in producers}]
    assert len(flows) == 2 * len(SIZES)
    assert all(f.get is not None for f in flows), "every message was read: every flow is linked"
    for f in flows:
        sent = _mark_before(trace, f.put, "put")
        got = _mark_after(trace, f.get, "got")
        assert sent == got, f"flow {f.put.args['msg']} links {sent} to the get of {got}"
        assert f.get.args["nbytes"] == f.nbytes


def test_a_message_written_before_recording_stays_unlinked():
    q = mp.get_context("fork").Queue()
    q.put("written before recording")
    with mt.record() as trace:
        q.put("written while recording, a different size")
        assert q.get(timeout=10) == "written before recording"
        assert q.get(timeout=10) == "written while recording, a different size"
    gets = trace.of_kind("queue.get")
    assert len(gets) == 2 and gets[0].args["msg"] is None     # no write explains it
    [flow] = trace.flows()
    assert flow.get is gets[1]                                # not shifted by one


def test_a_feeder_that_started_before_recording_still_links_by_envelope():
    q = multiprocessing.get_context("fork").Queue()
    q.put(b"x" * 100_000)                                     # starts the stdlib feeder thread
    assert len(q.get(timeout=10)) == 100_000
    with mt.record() as trace:
        ctx = multiprocessing.get_context("fork")
        back = ctx.Queue()
        p = start(ctx, tw.ping, q, back, 3)
        for i in range(3):
            q.put(("ping", i))                                # through the old feeder
        answers = [back.get(timeout=10) for _ in range(3)]
        finish(p)
    assert answers == [("ping", i) for i in range(3)]
    flows = trace.flows()
    assert len(flows) == 6 and all(f.get is not None for f in flows)
    assert sum(f.get.args.get("sig") is None for f in flows) == 3   # the pings: by envelope


def test_an_mpviz_queue_whose_feeder_started_before_recording_still_links():
    # mpviz's Queue feeds large items through the stdlib's feeder thread. One started before
    # recording has no write hook: its items must travel in an envelope, as the stdlib's do.
    q = mp.get_context("fork").Queue()
    q.put(b"x" * 200_000)                                     # bigger than the pipe: the feeder
    assert len(q.get(timeout=10)) == 200_000
    with mt.record() as trace:
        for i in range(3):
            q.put(bytes([i]) * 200_000)
            assert q.get(timeout=10)[:1] == bytes([i])
    q.close()
    q.join_thread()                                           # the feeder, and its pipe, gone
    flows = trace.flows()
    assert len(flows) == 3 and all(f.get is not None for f in flows)


def test_a_get_just_before_recording_ends_still_links():
    # The feeder records its write *before* writing: the reader can have the bytes, and the
    # recording can end, before the feeder thread runs another line.
    ctx = multiprocessing.get_context("fork")
    for i in range(20):
        with mt.record() as trace:
            q = ctx.Queue()
            q.put(i)
            assert q.get(timeout=10) == i
            q.close()
            q.join_thread()
        [flow] = trace.flows()
        assert flow.get is not None, f"round {i}: the read found no write"


@pytest.mark.parametrize("library", ["mpviz", "stdlib"])
def test_a_forked_child_records_its_reads_of_a_queue_its_parent_read(library):
    # The parent's first get wraps the queue's read; a fork resets the queue's _recv_bytes, so
    # the child must wrap its own again (a marker left in the copied __dict__ must not stop it).
    ctx = (mp if library == "mpviz" else multiprocessing).get_context("fork")
    with mt.record() as trace:
        q, back = ctx.Queue(), ctx.Queue()
        q.put("first")
        assert q.get(timeout=10) == "first"
        p = start(ctx, tw.ping, q, back, 1)
        q.put(("ping", 0))
        assert back.get(timeout=10) == ("ping", 0)
        finish(p)
    flows = trace.flows()
    assert len(flows) == 3 and all(f.get is not None for f in flows)
    assert {f.get.pid for f in flows} == {os.getpid(), p.pid}


def _pipe_history(rng, queues=3, n=60, min_step=1):
    """Events of writes and reads of a few pipes, per process log, as a Trace would read them:
    some reads of bytes written before recording (no write event), some writes never read.
    Each read also carries the truth, for the test: ``true_msg``, the write it really read
    (None: an unrecorded one), and ``clean``, True while no unrecorded write has gone before it
    in its pipe (from there on, identical bytes may be paired wrongly: see messages.py's module
    docstring)."""
    logs, ts = {pid: [] for pid in (1, 2, 3, 4)}, 0
    for q in range(queues):
        fifo, clean = [], True
        for i in range(n):
            ts += rng.randint(min_step, 5)
            nbytes, sig = rng.choice([8, 8, 40]), rng.randrange(3)
            if rng.random() < 0.55:
                if rng.random() < 0.1:                 # written, not recorded
                    fifo.append((nbytes, sig, None))
                    continue
                kind, pid = rng.choice([("queue.feed", 1), ("queue.put", 2)])
                msg = f"{pid}.{q}.{i}"
                fifo.append((nbytes, sig, msg))
                args = {"queue": f"q{q}", "msg": msg, "nbytes": nbytes, "sig": sig}
            elif fifo:
                nbytes, sig, true_msg = fifo.pop(0)
                clean = clean and true_msg is not None
                pid, kind = rng.choice([3, 4]), "queue.get"
                args = {"queue": f"q{q}", "nbytes": nbytes, "sig": sig, "true_msg": true_msg,
                        "clean": clean}
            else:
                continue
            logs[pid].append((ts, pid, pid, kind, args))
    return logs


def _copy(events):
    return [Event(*e[:4], dict(e[4])) for e in events]


def _link_as_polled(rng, logs, keep_log_order=False):
    """Feed `logs` to an OrderLinks poll by poll, as Trace.refresh does, and check after each
    poll that it links as link_by_order does on all events so far; the events, linked.

    What a poll reads of each log is a prefix of what is left of it, so events arrive late and
    out of order across logs. Each poll's events come shuffled (``add`` takes any order), or
    with `keep_log_order` each log's own in its order, as a reader reads a file: the order that
    breaks ties of time."""
    links, seen = messages.OrderLinks(), []
    while any(logs.values()):
        parts = []
        for pid, log in logs.items():
            take = rng.randint(0, len(log))
            parts.append(_copy(log[:take]))
            del log[:take]
        rng.shuffle(parts)
        new = [e for part in parts for e in part]
        if not keep_log_order:
            rng.shuffle(new)
        links.add(new)
        seen += new
        at_once = _copy(sorted(seen, key=order))
        messages.link_by_order(at_once)
        kept = sorted(seen, key=order)
        assert [e.args.get("msg") for e in kept] == [e.args.get("msg") for e in at_once]
    return seen


@pytest.mark.parametrize("seed", range(20))
def test_links_kept_up_to_date_equal_links_made_at_once(seed):
    rng = random.Random(seed)
    seen = _link_as_polled(rng, _pipe_history(rng))
    assert any(e.kind == "queue.get" and e.args["msg"] for e in seen)      # something linked
    assert any(e.kind == "queue.get" and not e.args["msg"] for e in seen)  # something not
    # ... and right: every read with no unrecorded write before it got the write it read
    clean = [e for e in seen if e.kind == "queue.get" and e.args["clean"]]
    assert clean and all(e.args["msg"] == e.args["true_msg"] for e in clean)


@pytest.mark.parametrize("seed", range(10))
def test_links_kept_up_to_date_equal_links_made_at_once_when_times_tie(seed):
    # Events of several processes (or one) at the same nanosecond: kept and at-once links still
    # agree. (Which of two reads at one time came first no clock can say, so no truth here.)
    rng = random.Random(seed)
    _link_as_polled(rng, _pipe_history(rng, min_step=0), keep_log_order=True)
