"""Pictures and words that must agree with what happened (issue #19's first items).

A student believes the picture. These tests run small real programs (and scenarios) under
``record()`` and check that what is drawn and said is what the processes did: a message is
green ("only a handle travelled") exactly when its sender pickled a handle into it, whatever the
receiver did just before; the counts in ``viz.summary`` are exact.
"""
import multiprocessing as stdlib_mp
import os
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import truth_workers as w  # noqa: E402

import mpviz  # noqa: E402
import mpviz.multiprocessing as mp  # noqa: E402
import mpviz.trace as mt  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.viz import COLORS  # noqa: E402
from mpviz.viz.state import _index  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def arrow_colors(fig):
    """{message id: colour} of the timeline's arrows, in the order the flows were drawn."""
    return [to_hex(p.get_edgecolor()) for ax in fig.axes for p in ax.patches
            if isinstance(p, FancyArrowPatch)]


def by_sender(trace, pid):
    """The messages `pid` sent, in order, each as (nbytes, handles its sender counted)."""
    handles = _index(trace).handles
    return [(f.nbytes, handles.get(f.put.args.get("msg"), 0)) for f in trace.flows()
            if f.put.pid == pid]


# --- arrows: classified by what the message carried ---------------------------------------------

@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_report_after_a_get_is_a_pickled_message_not_a_handle(start_method, strategy):
    """The child's report (a dict and a list) comes right after it mapped the tensor it got:
    it is grey; the tensor it sends back (which the parent maps already, so nothing is attached
    on arrival) is green. Handles in all: 2 (the parent's tensor, the child's re-send)."""
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy(strategy)
    ctx = mp.get_context(start_method)
    try:
        with mt.record() as trace:
            inbox, outbox, done = ctx.Queue(), ctx.Queue(), ctx.Event()
            child = ctx.Process(target=w.echo_report, args=(inbox, outbox, done), name="child")
            child.start()
            t = mpviz.ones(1000)
            inbox.put(t)
            report = outbox.get()
            back = outbox.get()
            done.set()
            child.join()
    finally:
        mp.set_sharing_strategy(old)
    assert report["seen"] == [1, 2, 3] and back.untyped_storage() is t.untyped_storage()
    sent = by_sender(trace, child.pid)
    assert len(sent) == 2
    (report_bytes, report_handles), (_, back_handles) = sent
    assert report_handles == 0 and report_bytes > 40           # a pickled dict and list
    assert back_handles == 1                                   # the re-sent tensor
    assert sum(_index(trace).handles.values()) == 2            # parent's tensor + child's re-send
    assert "3 messages: 2 carried shared-memory handles (2 in all" in viz.summary(trace)
    colors = arrow_colors(viz.timeline(trace))
    assert colors.count(COLORS["handle"]) == 2 and colors.count(COLORS["message"]) == 1


def test_pipe_and_simple_queue_say_what_they_carried():
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        here, there = ctx.Pipe()
        p = ctx.Process(target=w.echo_report_pipe, args=(there,), name="pipe child")
        p.start()
        t = mpviz.ones(100)
        here.send(t)
        here.recv()
        here.recv()
        here.send("bye")
        p.join()
        inbox, outbox, done = ctx.SimpleQueue(), ctx.SimpleQueue(), ctx.Event()
        s = ctx.Process(target=w.echo_report_simple, args=(inbox, outbox, done), name="sq child")
        s.start()
        inbox.put(mpviz.ones(100))
        outbox.get()
        outbox.get()
        done.set()
        s.join()
    for pid in (p.pid, s.pid):
        assert [h for _, h in by_sender(trace, pid)][:2] == [0, 1]


def test_stdlib_queue_feeder_says_what_it_carried():
    """The stdlib's Queue pickles in its feeder thread (under the C writer, the count comes as a
    ``queue.handles`` event just before the write): the same answer."""
    ctx = stdlib_mp.get_context("fork")
    with mt.record() as trace:
        inbox, outbox, done = ctx.Queue(), ctx.Queue(), ctx.Event()
        p = ctx.Process(target=w.stdlib_queue_report, args=(inbox, outbox, done), name="child")
        p.start()
        inbox.put(mpviz.ones(100))
        outbox.get()
        outbox.get()
        done.set()
        p.join()
        for q in (inbox, outbox):
            q.close()
            q.join_thread()
    assert [h for _, h in by_sender(trace, p.pid)] == [0, 1]
    assert by_sender(trace, os.getpid()) == [(by_sender(trace, os.getpid())[0][0], 1)]


@pytest.mark.parametrize("name, receiver, handles", [("producer-exits", "consumer", [0, 0]),
                                                     ("cuda-producer-exits", "consumer", [0, 0, 0]),
                                                     ("cuda-repass", "relay", [0])])
def test_scenarios_reports_are_pickled(name, receiver, handles):
    """In these scenarios the consumer's messages to the driver are reports, never handles (the
    old rule drew the first one green because the consumer had just mapped memory); the
    producer's tensors are the only handles."""
    import mpviz.scenarios as sc
    r = sc.run(name)
    consumer = next(p.pid for p in r.trace.processes() if p.name == receiver)
    assert [h for _, h in by_sender(r.trace, consumer)] == handles
    assert sum(_index(r.trace).handles.values()) == (2 if name == "producer-exits" else 1)
