"""Big real runs drawn so a person can read them (issue #27, item 4): helper threads on their
process's lane, and every aggregation said, with honest counts, under the lanes.

A Pool's handler threads and a Manager's connection threads are multiprocessing's own
machinery: they fold into their process's lane, and so do Queue feeders when the picture is crowded -- unless one of them is the story
(here: a feeder its process joins at exit while the pipe is full, CPython issue 91594's
shape). The drawing's speed is measured by bench/bench_dataloader_trace.py, not here.
"""
import os
import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import size_workers as w  # noqa: E402

import mpviz.multiprocessing as mp  # noqa: E402
import mpviz.trace as mt  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.trace import analysis as st  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A Pool of 8 in the parent (three handler threads; 14 lanes in all: crowded), then a child whose
# feeder is joined at exit while the pipe is full, and a parent that joins it before reading.
EXIT_HANG = textwrap.dedent("""
    import multiprocessing as mp

    def child(q):
        for i in range(20_000):
            q.put(i)

    if __name__ == "__main__":
        with mp.Pool(8) as pool:
            print(sum(pool.map(abs, range(-50, 0))))
        q = mp.Queue()
        p = mp.Process(target=child, args=(q,))
        p.start()
        p.join()
""")


@pytest.fixture(autouse=True)
def _fonts(fonts_loaded):
    """(see conftest.fonts_loaded)"""


def _lanes(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def _note(fig):
    return " ".join(t.get_text().replace("\n", " ") for t in fig.axes[0].texts
                    if t.get_gid() == "aggregated")


def test_pool_handler_threads_fold_into_their_process_but_a_stuck_feeder_keeps_its_lane(
        tmp_path):
    program = tmp_path / "exit_hang.py"
    program.write_text(EXIT_HANG)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--hang-after", "1",
                           "--no-plot", "-o", str(tmp_path / "t"), "--", sys.executable,
                           str(program)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 124, done.stderr[-2000:]                # the watchdog ended it
    trace = mt.load(tmp_path / "t")
    ix = st._index(trace)
    names = {ix.thread_name(*who) for who in ix.busy}
    assert any("_handle_tasks" in n for n in names)          # recorded, so there to fold
    fig = viz.timeline(trace)
    lanes = _lanes(fig)
    assert not [n for n in lanes if "_handle" in n], lanes    # folded into main's lane
    assert [n for n in lanes if "QueueFeederThread" in n] == ["└ QueueFeederThread"], lanes
    handlers = [who for who in ix.busy if "_handle" in ix.thread_name(*who)]
    assert f"{len(handlers)} helper thread{'s' * (len(handlers) > 1)} (Pool handlers, Queue " \
           f"feeders, fd servers, a Manager's connections) drawn on their process's lane" \
        in _note(fig), _note(fig)


# A Manager's server runs a handle_request thread per connection: 4 clients, 17 threads.
MANAGER = textwrap.dedent("""
    import multiprocessing as mp

    def work(d, i):
        for j in range(20):
            d[(i, j)] = j

    if __name__ == "__main__":
        with mp.Manager() as m:
            d = m.dict()
            ps = [mp.Process(target=work, args=(d, i)) for i in range(4)]
            for p in ps:
                p.start()
            for p in ps:
                p.join()
            print(len(d))
""")


def test_a_managers_connection_threads_fold_into_its_server_process(tmp_path):
    program = tmp_path / "manager.py"
    program.write_text(MANAGER)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--no-plot", "-o",
                           str(tmp_path / "t"), "--", sys.executable, str(program)],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    trace = mt.load(tmp_path / "t")
    ix = st._index(trace)
    served = [who for who in ix.busy if "handle_request" in ix.thread_name(*who)]
    assert len(served) >= 4 and {pid for pid, _ in served} <= set(ix.managers)   # one a client
    fig = viz.timeline(trace)
    lanes = _lanes(fig)
    assert not [n for n in lanes if "handle_request" in n], lanes
    assert [n for n in lanes if n.startswith("Process-")] and \
        [n for n in lanes if n.startswith("SyncManager")], lanes
    assert f"{len(served)} helper threads" in _note(fig), _note(fig)


def test_a_big_run_is_aggregated_and_the_note_counts_what_was_aggregated():
    # 1,000 messages there and back and 1,500 marks: more than the picture draws one by one
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        inbox, outbox = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=w.echo_and_mark, args=(inbox, outbox, 1000, 1500))
        p.start()
        for i in range(1000):
            inbox.put(i)
            assert outbox.get(timeout=30) == i
        p.join()
    ix = st._index(trace)
    got = [f for f in ix.flows if f.get is not None]
    marks = [e for e in trace.events if e.kind == "mark" and e.args.get("name") == "step"]
    assert len(got) == 2000 and len(marks) == 1500
    fig = viz.timeline(trace)
    note = _note(fig)
    drawn = {c.get_gid(): c for c in fig.axes[0].collections}
    bundles = len(drawn["messages"].get_segments())
    ticks = len(drawn["marks"].get_offsets())
    assert f"2,000 messages drawn as {bundles:,} bundles" in note, note
    assert f"1,500 marks drawn as {ticks:,} ticks (one per pixel column)" in note, note
    waited = [b for b in ix.blocked if b[3] is not None]
    if len(waited) > 200:            # the gets that waited: painted as a share, and counted
        assert f"{len(waited):,} waits painted as the share of each pixel column" in note
