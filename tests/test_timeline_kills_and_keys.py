"""The timeline draws what its words and its legend say, on three real hangs traced at once:

* notebook 12's straggler (mpviz/examples/distributed.py): rank 0 waits in all_reduce #2 for a
  slow rank 1 until the watchdog kills both -- a wait's label, and a kill under a wait box;
* a parent that joins a child whose Queue feeder is blocked on a full pipe: stuck for good,
  on no lock (nothing hatched in crimson);
* two processes that take two Locks in opposite orders: stuck for good on locks (their waits
  hatched in crimson).
"""
import importlib
import os
import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.examples import distributed as dd  # noqa: E402
from mpviz.viz import COLORS  # noqa: E402
from test_learner_words import JOIN_BEFORE_GET  # noqa: E402

timeline = importlib.import_module("mpviz.viz.timeline")   # (viz.timeline: the function)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAMS = {
    "full_pipe.py": JOIN_BEFORE_GET,
    "two_locks.py": """
        import multiprocessing as mp

        def transfer(first, second, ready, go):
            with first:
                ready.set()
                go.wait()
                with second:
                    pass

        if __name__ == "__main__":
            a, b = mp.Lock(), mp.Lock()
            ready, go = [mp.Event(), mp.Event()], mp.Event()
            ps = [mp.Process(target=transfer, args=(a, b, ready[0], go)),
                  mp.Process(target=transfer, args=(b, a, ready[1], go))]
            for p in ps:
                p.start()
            for e in ready:
                e.wait()
            go.set()
            for p in ps:
                p.join()
        """,
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory, fonts_loaded):
    """{name: Trace} of the three hangs, traced side by side."""
    tmp = tmp_path_factory.mktemp("hangs")
    env = dict(os.environ, PYTHONPATH=ROOT, MASTER_PORT=str(dd.free_port()))
    started = {}
    for name, text in [*PROGRAMS.items(), ("straggler", None)]:
        (tmp / name).mkdir()
        program = ["-m", "mpviz.examples.distributed", "straggler"] if text is None else \
            [str(tmp / name / name)]
        if text is not None:
            (tmp / name / name).write_text(textwrap.dedent(text))
        started[name] = subprocess.Popen(
            [sys.executable, "-m", "mpviz", "trace", "--hang-after", "1", "--no-plot", "-o",
             str(tmp / name / "trace"), "--", sys.executable, *program], cwd=tmp / name,
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = {}
    for name, proc in started.items():
        _, err = proc.communicate(timeout=150)
        assert proc.returncode == 124, err                    # each is a hang
        out[name] = mt.load(tmp / name / "trace")
    return out


def _drawn(trace):
    fig = viz.timeline(trace)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return fig, fig.axes[0], renderer


@pytest.mark.timeout(200)
def test_a_waits_label_is_written_over_its_wait_not_over_what_came_before(traces):
    trace = traces["straggler"]
    fig, ax, renderer = _drawn(trace)
    (label,) = [t for t in ax.texts if t.get_text() == "all_reduce #2: waits for rank 1"]
    x0 = ax.transData.transform((label.xy[0], 0))[0]          # the wait's start, in pixels
    assert label.get_visible()
    assert label.get_window_extent(renderer).x0 >= x0 - 1      # (centred: half over the init)


@pytest.mark.timeout(200)
def test_a_killed_rank_shows_its_kill_over_the_waits_that_may_hide_its_bar(traces):
    # rank 0's all_reduce #2 box, white and hatched, lies over its life bar up to where the
    # watchdog judged (and it killed the ranks then, or a little later): the kill is drawn
    # over every box, at the end of each killed process's bar, on its lane
    trace = traces["straggler"]
    fig, ax, _ = _drawn(trace)
    (waits,) = [c for c in ax.collections if c.get_gid() == "collective waits"]
    (lives,) = [c for c in ax.collections if c.get_gid() == "lives"]
    (kills,) = [c for c in ax.collections if c.get_gid() == "kills"]
    assert kills.get_zorder() > waits.get_zorder()
    killed = [p for p in trace.processes() if p.signal == "SIGKILL"]
    assert len(killed) >= 3                            # the launcher's child and both ranks
    ends = sorted((round(b.get_extents().x1, 3), round((b.get_extents().y0 +
                                                         b.get_extents().y1) / 2, 3))
                  for b in lives.get_paths())
    marks = sorted((round(s[0][0], 3), round((s[0][1] + s[1][1]) / 2, 3))
                   for s in kills.get_segments())
    assert marks == ends                               # (every process here was killed)


def _stuck_swatch(ax):
    (handle,) = [h for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts())
                 if t.get_text() == "stuck for good (deadlock)"]
    return handle.get_hatch()


@pytest.mark.timeout(200)
def test_the_stuck_swatch_is_hatched_only_where_the_picture_hatches_stuck_waits(traces):
    crimson = to_hex(COLORS["deadlock"])
    for name, hatched in (("full_pipe.py", False), ("two_locks.py", True)):
        fig, ax, _ = _drawn(traces[name])
        drawn = any(c.get_hatch() and to_hex(c.get_edgecolor()[0]) == crimson
                    for c in ax.collections if len(c.get_edgecolor()))
        assert drawn is hatched, name
        assert bool(_stuck_swatch(ax)) is hatched, name


@pytest.mark.timeout(200)
def test_the_thread_lanes_are_judged_once_per_picture(traces, monkeypatch):
    calls = []
    judge = timeline._thread_lanes

    def counted(*args):
        calls.append(args)
        return judge(*args)

    monkeypatch.setattr(timeline, "_thread_lanes", counted)
    viz.timeline(traces["full_pipe.py"])
    assert len(calls) == 1
