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
from mpviz.trace.analysis import _index  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def _fonts(fonts_loaded):
    """(see conftest.fonts_loaded)"""


def arrow_colors(fig):
    """{message id: colour} of the timeline's arrows, in the order the flows were drawn."""
    return [to_hex(p.get_edgecolor()) for ax in fig.axes for p in ax.patches
            if isinstance(p, FancyArrowPatch)]


def by_sender(trace, pid):
    """The messages `pid` sent, in order, each as (nbytes, handles its sender counted)."""
    handles = _index(trace).handles              # {message id: handles its sender counted}
    count = handles.get if isinstance(handles, dict) else lambda m, _: int(m in handles)
    return [(f.nbytes, count(f.put.args.get("msg"), 0)) for f in trace.flows()
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
    assert sum(h for _, h in by_sender(trace, os.getpid()) + sent) == 2   # tensor + re-send
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


@pytest.mark.parametrize("writer", ["C", "Python"])
def test_stdlib_queue_feeder_says_what_it_carried(writer, monkeypatch):
    """The stdlib's Queue pickles in its feeder thread: its write event (``queue.feed``) carries
    the count, with the Python Writer and with the C one alike (the C one once wrote a
    ``queue.handles`` event of its own before each such write: one more event a message)."""
    from mpviz.trace import native
    if writer == "C" and native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if writer == "Python" else "0")
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
    assert [h for _, h in by_sender(trace, os.getpid())] == [1]
    assert not trace.of_kind("queue.handles")
    carried = [e.args.get("handles") for e in trace.of_kind("queue.feed") if e.pid == p.pid]
    assert carried == [None, 1]


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
    senders = {f.put.pid for f in r.trace.flows()}
    assert sum(h for pid in senders for _, h in by_sender(r.trace, pid)) == \
        (2 if name == "producer-exits" else 1)


# --- the timeline's failures, at true time -------------------------------------------------------

def draw(fig):
    """Render `fig` (labels are placed, and notes written, at draw time)."""
    import io
    fig.savefig(io.BytesIO(), format="png")


def crosses(fig):
    """(x, row) of each magenta ✗, and the words written next to them."""
    ax = fig.axes[0]
    where = [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in ax.lines
             if ln.get_marker() == "X" and to_hex(ln.get_color()) == COLORS["failed"]]
    draw(fig)
    words = [t.get_text() for t in ax.texts if t.get_text().startswith("✗")]
    return where, words


def lane(fig, label):
    """The row of the lane whose label starts with `label`."""
    names = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    return next(i for i, n in enumerate(names) if n.startswith(label))


@pytest.fixture(scope="module")
def producer_exits():
    import mpviz.scenarios as sc
    return sc.run("producer-exits")


def test_producer_exits_at_true_time_the_late_get_fails_after_the_producer_ended(producer_exits):
    """Notebook 03's story, drawn as it happened: the second handle is got after the producer's
    lane has ended, and that get is marked as failed on the consumer's lane."""
    trace = producer_exits.trace
    fig = viz.timeline(trace, compress_idle=False)
    assert "squeezed" not in fig.axes[0].get_xlabel()
    t0 = trace.events[0].ts_ns
    producer = next(p for p in trace.processes() if p.name == "producer")
    late = [f for f in trace.flows() if f.put.pid == producer.pid][1]
    assert late.get is not None and late.get.ts_ns > producer.exit_ns   # got, after the exit
    where, words = crosses(fig)
    assert words == ["✗ get failed: ProducerExitedError"]
    (x, row), = where
    assert row == lane(fig, "consumer")
    assert x > (producer.exit_ns - t0) / 1e6                  # right of the producer's end


def test_notebook_03_describes_what_is_drawn():
    import json
    path = os.path.join(os.path.dirname(__file__), "..", "notebooks", "03_sharing_strategies.ipynb")
    cells = ["".join(c["source"]) for c in json.load(open(path))["cells"]]
    draw = next(i for i, c in enumerate(cells) if 'scenarios.run("producer-exits")' in c)
    assert "compress_idle=False" in cells[draw]
    story = " ".join(cells[draw + 1].split())
    assert "never got" not in story and "✗" in story and "1 s later" in story


def test_failed_put_is_marked_on_its_lane(tmp_path):
    """A put that raised (here Full, on a bounded mpviz Queue) is drawn as ✗ where it failed;
    the Chrome export shows it too, and the queue's depth never goes below 0 (mpviz's Queue
    records no put before a put that fails)."""
    import json
    import queue
    with mt.record() as trace:
        q = mp.Queue(maxsize=1)
        q.put(1)
        with pytest.raises(queue.Full):
            q.put(2, block=False)
        q.get()
    fails = viz.failures(trace)
    assert [(f.pid, f.what) for f in fails] == [(os.getpid(), "put failed: Full")]
    _, words = crosses(viz.timeline(trace))
    assert words == ["✗ put failed: Full"]
    trace.to_chrome(tmp_path / "t.json")
    chrome = json.load(open(tmp_path / "t.json"))["traceEvents"]
    depths = [e["args"]["depth"] for e in chrome if e.get("ph") == "C" and
              "depth" in e.get("name", "")]
    assert depths and min(depths) >= 0 and depths[-1] == 0
    assert [e["args"]["error"] for e in chrome if e.get("name") == "queue.put_failed"] == ["Full"]


@pytest.mark.parametrize("name, who, what", [
    ("cuda-repass", "relay", "put failed: CudaResendError"),
    ("cuda-producer-exits", "consumer", "read of freed memory"),
    ("queue-join-deadlock", "└ QueueFeederThread", "write blocked: pipe full")])
def test_scenario_failures_are_marked_on_their_lanes(name, who, what):
    import mpviz.scenarios as sc
    r = sc.run(name)
    fig = viz.timeline(r.trace)
    where, words = crosses(fig)
    assert len(where) == 1 and words[0].startswith("✗ " + what)
    assert where[0][1] == lane(fig, who)


def test_legend_explains_ticks_lost_messages_and_hidden_labels():
    import mpviz.scenarios as sc
    from mpviz.viz import WORDS
    r = sc.run("queue-join-deadlock")
    fig = viz.timeline(r.trace)
    draw(fig)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert WORDS["event"] in legend and "ticks" in WORDS["event"]
    assert WORDS["lost"] in legend and WORDS["failed"] in legend
    notes = [t.get_text() for t in ax.texts if "never got" in t.get_text()]
    assert notes and notes[0].startswith("1 message never got (▸)")
    note = next(t for t in ax.texts if "never got" in t.get_text())
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    # over the top right corner of the lanes, never on them
    assert note.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1 - 0.5
    if "hidden" in notes[0]:
        assert "no free room" in notes[0] or "no room to write" in notes[0]


def test_stuck_reasons_name_the_users_line_and_locks_by_name():
    import mpviz.scenarios as sc
    r = sc.run("fork-held-lock")
    reasons = [d.reason for d in viz.deadlocks(r.trace)]
    assert reasons
    for reason in reasons:
        assert "popen_fork.py" not in reason and "locks.py" not in reason
        assert "at your line fork_held_lock.py:" in reason
    child = next(x for x in reasons if "waits forever" in x)
    assert "lock '_library_lock'" in child and "use_library" in child
    text = viz.state_at(r.trace, viz.stuck_moment(r.trace)).text()
    assert "lock '_library_lock'" in text
    assert not __import__("re").search(r"\bt\d+\.\d+\b", text)   # no internal lock id
    r = sc.run("queue-join-deadlock")
    text = viz.state_at(r.trace, viz.stuck_moment(r.trace)).text()
    assert "on Queue 1" in text and "sem-" not in text and "mp-" not in text
    reasons = " ".join(d.reason for d in viz.deadlocks(r.trace))
    assert "queue_join_deadlock.py:" in reasons and "popen_fork.py" not in reasons


# --- notebooks 00 and 06, viz.plot --------------------------------------------------------------

def _cells(name):
    import json
    path = os.path.join(os.path.dirname(__file__), "..", "notebooks", name)
    return json.load(open(path))["cells"]


def test_notebook_00_table_lists_every_notebook():
    import glob
    import re
    table = "".join(_cells("00_overview.ipynb")[2]["source"])
    linked = set(re.findall(r"\]\((\d\d_[a-z_]+\.ipynb)\)", table))
    here = {os.path.basename(p) for p in glob.glob(
        os.path.join(os.path.dirname(__file__), "..", "notebooks", "[0-9][0-9]_*.ipynb"))}
    assert linked == here - {"00_overview.ipynb"}   # every notebook but 00, each once


def test_notebook_06_says_which_api_is_mpviz_only():
    """Every cell that uses mpviz-only CUDA API (or mpviz's own memory_stats keys, or the count
    ipc_collect returns) says so, in the cell or the text just above it."""
    import re
    cells = _cells("06_cuda_lifetime.ipynb")
    only = re.compile(r"backend\(\)|why_simulator|ipc_info|held_for_consumers_bytes|"
                      r"limbo_blocks|ipc_collect\(\)")
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        if c["cell_type"] != "code" or not only.search(src) or "solution" in c.get(
                "metadata", {}).get("tags", []):
            continue
        above = "".join(cells[i - 1]["source"]) if i else ""
        assert "mpviz" in src.replace("import mpviz", "").replace("mpviz.", "") or \
            "mpviz" in above, f"cell {i} uses mpviz-only API without saying so:\n{src}"
    intro = "".join(cells[1]["source"])
    assert "returns `None`" in intro and "mpviz-only" in intro


def test_plot_drops_an_empty_wait_for_panel_and_the_memory_map_is_not_blank():
    import mpviz.scenarios as sc
    clean = sc.run("queue-sharing")
    fig = viz.plot(clean)
    assert len(fig.axes) == 2                    # timeline and memory map: no lock, nothing stuck
    mm = fig.axes[1]
    greens = [p for p in mm.patches if to_hex(p.get_facecolor()) == COLORS["mapped"]]
    assert greens, "the memory map shows who mapped the segment, not a row of white cells"
    # Drawn at the end, the map would be all white (freed); then it is drawn when the most were
    # mapped, and says so. But the parent's second offer of the tensor keeps its segment until
    # its fd server thread reads the child's release (fd_passing.release: within 5 ms, or at
    # the child's exit): on a busy machine that came after the scenario's end (a fresh-clone
    # run), the segment was still mapped at the end -- and the map, drawn there, says so.
    end = viz._index(clean.trace).segment_states(viz._index(clean.trace).t1)
    title = mm.get_title(loc="left")
    if all(s.status == "freed" for s in end):
        assert "when the most were mapped" in title, title
    else:
        assert [s.status for s in end] == ["in use"], end
        assert "when the most were mapped" not in title and "none leaked" in title, title
    stuck = sc.run("fork-held-lock")             # a lock, a deadlock, no shared memory:
    titles = [ax.get_title(loc="left") for ax in viz.plot(stuck).axes]
    assert len(titles) == 2 and titles[1].startswith("Who waits for whom")   # no empty map


def test_a_forked_childs_stuck_reason_names_the_parents_line_it_inherited():
    # A forked child stuck at exit (joining its queue's feeder) has no line of its own on its
    # stack; below the fork, its dump shows the parent's frames ending in the user's
    # `child.start()`. The reason said "no line of yours on its stack", which the dump printed
    # in the terminal contradicted.
    import sysconfig

    from mpviz.trace.analysis import user_line
    lib = sysconfig.get_paths()["stdlib"] + "/multiprocessing"
    dump = (
        'Current thread 0x00007f (most recent call first):\n'
        f'  File "{lib}/threading.py", line 1112 in _wait_for_tstate_lock\n'
        f'  File "{lib}/queues.py", line 199 in _finalize_join\n'
        f'  File "{lib}/util.py", line 360 in _exit_function\n'
        f'  File "{lib}/process.py", line 317 in _bootstrap\n'
        f'  File "{lib}/popen_fork.py", line 71 in _launch\n'
        f'  File "{lib}/popen_fork.py", line 19 in __init__\n'
        '  File "/home/me/hang_join.py", line 23 in main\n')
    words = user_line(dump)
    assert "no line of yours in its own frames: while exiting" in words
    assert "parent's frames, which end in your line hang_join.py:23 in main()" in words
