"""The timeline's layout, measured in pixels on real recorded runs: what a student believes is
what is drawn, so nothing may be drawn out of sight, over another text, or too thin to see.

Three real runs, recorded once for the module (docs/TRACE.md's pictures are drawn from the same):

* fork-held-lock: a library's worker thread holds a lock for about 2 ms while main forks; the
  child waits forever for the copied lock (the watchdog kills both after ~2.5 s). The hold is
  the lesson, and on a 2.8 s axis it is narrower than a pixel.
* producer-exits (wait=True): the tutorial's producer and consumer under spawn, with its many
  labels (waits, copies, messages, marks) close together.
* hang_join.py under ``mpviz trace --hang-after 2``: a child whose feeder thread is blocked on
  a full pipe; two long STUCK explanations.

Four more runs from the notebooks (pool-chunksize, queue-sharing, producer-exits and a Pool's
two apply_async jobs) check that a label covers no box but its own and is written at its mark;
a forked child that lives a few ms of a 5 s picture checks that its life bar is still seen.

Each picture is drawn with the Agg renderer and checked by its artists' window extents.
"""
import os
import re
import subprocess
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz import scenarios, viz  # noqa: E402
from mpviz.viz import COLORS  # noqa: E402
from mpviz.trace import analysis as state  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_PX = 3          # the least width of a drawn hold or wait, in pixels (what the task asks)


@pytest.fixture(scope="module")
def fork_lock():
    result = scenarios.run("fork-held-lock")
    assert viz.deadlocks(result.trace), result.outcome
    return result.trace


@pytest.fixture(scope="module")
def producer_consumer():
    return scenarios.run("producer-exits", wait=True).trace


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    """docs/TRACE.md's `mpviz trace --hang-after 2 -- python hang_join.py`, loaded back."""
    out = tmp_path_factory.mktemp("hang") / "trace"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--hang-after", "2",
                          "--no-plot", "-o", str(out), "--", sys.executable,
                          os.path.join(ROOT, "notebooks", "programs", "hang_join.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    trace = mt.load(str(out))
    assert viz.deadlocks(trace), run.stdout + run.stderr
    return trace


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded(fork_lock, producer_consumer, hang):
    """Draw each once before the tests: matplotlib keeps a font file open the first time it
    needs it, which the per-test leak check would otherwise count."""
    for trace in (fork_lock, producer_consumer, hang):
        drawn(trace)


def drawn(trace):
    """The timeline of `trace`, drawn by Agg at the notebook's 100 dpi; (fig, ax, renderer)."""
    fig = viz.timeline(trace)
    fig.set_dpi(100)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig, fig.axes[0], fig.canvas.get_renderer()


def visible_texts(fig):
    """Every text the figure shows: labels, notes, lane and tick names, title, axis name, legend."""
    out = []
    for ax in fig.axes:
        out += [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        lo, hi = sorted(ax.get_xlim())
        out += [t for t in ax.get_yticklabels() if t.get_visible() and t.get_text().strip()]
        out += [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()
                and lo <= t.get_position()[0] <= hi]          # (ticks out of view: not drawn)
        out += [t for t in (ax.title, ax._left_title, ax.xaxis.label) if t.get_text().strip()]
        if ax.get_legend():
            out += [t for t in ax.get_legend().get_texts() if t.get_text().strip()]
    return out + [t for t in fig.texts if t.get_visible() and t.get_text().strip()]


def extent(text, renderer):
    """A text's box as a reader sees it: with its white background patch, if it has one."""
    box = text.get_window_extent(renderer)
    patch = text.get_bbox_patch()
    if patch is not None:
        from matplotlib.transforms import Bbox
        box = Bbox.union([box, patch.get_window_extent(renderer)])
    return box


def stuck_boxes(ax):
    """The red frames drawn round a process stuck for good."""
    return [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()
            and to_hex(p.get_edgecolor()) == COLORS["deadlock"]]


TRACES = ["fork_lock", "producer_consumer", "hang"]


def pictures(request):
    """(name, fig, ax, renderer) for each of the three runs."""
    for name in TRACES:
        yield (name, *drawn(request.getfixturevalue(name)))


def test_every_text_is_inside_the_figure_and_a_stuck_text_inside_its_box(request):
    for name, fig, ax, renderer in pictures(request):
        whole = fig.bbox
        for text in visible_texts(fig):
            box = text.get_window_extent(renderer)
            assert (box.x0 >= whole.x0 - 1 and box.x1 <= whole.x1 + 1 and
                    box.y0 >= whole.y0 - 1 and box.y1 <= whole.y1 + 1), \
                f"{name}: {text.get_text()!r} is drawn at {box}, out of the figure {whole}"
        stuck = [t for t in ax.texts if t.get_text().startswith("STUCK FOR GOOD")]
        frames = [p.get_window_extent(renderer) for p in stuck_boxes(ax)]
        assert len(frames) == len(stuck) == {"producer_consumer": 0, "fork_lock": 2,
                                             "hang": 2}[name]
        for text in stuck:
            box = text.get_window_extent(renderer)
            mine = [f for f in frames if f.x0 <= box.x0 <= f.x1 and f.y0 <= box.y1 <= f.y1]
            assert mine, f"{name}: {text.get_text()!r} starts in no red box"
            frame = mine[0]
            assert frame.x0 < box.x0 and box.x1 < frame.x1 and frame.y0 < box.y0 \
                and box.y1 < frame.y1, (f"{name}: {text.get_text()!r} ({box}) runs out of its "
                                        f"red box ({frame})")


def test_no_two_texts_overlap(request):
    for name, fig, ax, renderer in pictures(request):
        texts = visible_texts(fig)
        assert len(texts) >= 6
        boxes = [(t.get_text(), extent(t, renderer)) for t in texts]
        for i, (a, box_a) in enumerate(boxes):
            for b, box_b in boxes[i + 1:]:
                assert not box_a.overlaps(box_b), \
                    f"{name}: {a!r} ({box_a}) is drawn over {b!r} ({box_b})"


def test_the_lanes_get_the_width_of_a_notebook_and_the_legend_goes_under_them(request):
    # a notebook shows a picture about 1000 pixels wide: the lanes, not the legend, get it
    for name, fig, ax, renderer in pictures(request):
        tight = fig.get_tightbbox(renderer)              # what savefig(bbox_inches="tight") keeps
        assert tight.width * 100 <= 1000 + 1, f"{name}: {tight.width * 100:.0f} px wide"
        lanes = ax.get_window_extent(renderer)
        assert lanes.width >= 0.75 * fig.bbox.width, \
            f"{name}: the lanes get {lanes.width:.0f} of {fig.bbox.width:.0f} pixels"
        key = ax.get_legend().get_window_extent(renderer)
        assert key.y1 < lanes.y0, f"{name}: the legend is beside the lanes, not under them"


def test_the_short_lock_hold_over_the_fork_is_visible_and_says_how_long(fork_lock):
    ix = state._index(fork_lock)
    holds = [h for lk in ix.lock_infos.values() for h in lk.holds
             if ix.thread_name(h.pid, h.tid) == "library-worker"]
    assert len(holds) == 1 and holds[0].release_ns is not None
    hold = holds[0]
    true_ms = (hold.release_ns - hold.acquire_ns) / 1e6
    child = [pid for pid, (parent, _, _) in ix.forker.items() if parent == hold.pid]
    assert len(child) == 1
    fig, ax, renderer = drawn(fork_lock)
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    row = lanes.index("└ library-worker")
    # (its true width is about a pixel: 2-4 ms of a 2.8 s axis 870 pixels wide)

    # the hold bar on the library-worker's lane, at least MIN_PX pixels wide
    widths = []
    for c in ax.collections:
        if not isinstance(c, LineCollection) or not len(c.get_colors()) or \
                to_hex(c.get_colors()[0]) != COLORS["holding"]:
            continue
        for seg in c.get_segments():
            if row - 0.5 < seg[0][1] < row + 0.5:
                (x0, _), (x1, _) = ax.transData.transform(seg)
                widths.append(abs(x1 - x0))
    assert widths and max(widths) >= MIN_PX - 1e-6, \
        f"the library-worker's hold is drawn {widths} pixels wide"

    # and it says how long it truly was, and that main forked the child during it
    said = [t for t in ax.texts if t.get_visible() and t.get_text().startswith("held ")]
    assert len(said) == 1, [t.get_text() for t in ax.texts if t.get_visible()]
    words = said[0].get_text()
    value, unit = re.search(r"([\d.]+) (µs|ms|s)\b", words).groups()
    ms = float(value) * {"µs": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    assert abs(ms - true_ms) <= 0.05 * true_ms + 0.05, (words, true_ms)
    assert "_library_lock" in words and f"fork of child (pid {child[0]})" in words
    # written beside the bar, on the library-worker's lane
    y = ax.transData.inverted().transform(said[0].get_window_extent(renderer).get_points())
    assert row - 0.5 < y[:, 1].mean() < row + 0.5


def _a_short_lock_wait():
    """A trace in which, 2.5 s after it began, main waits about a millisecond for a lock a
    thread holds; (trace, how long main waited in ms)."""
    import threading
    import time
    with mt.record(threading_locks=True) as trace:
        time.sleep(2.5)
        lock, taken = threading.Lock(), threading.Event()

        def hold():
            with lock:
                taken.set()
                time.sleep(0.001)
        helper = threading.Thread(target=hold, name="holder")
        helper.start()
        taken.wait()
        with lock:                         # waits until the holder lets go
            pass
        helper.join()
    waits = [w for w in state._index(trace).waits if w[1] == os.getpid() and w[4] is not None]
    if not waits:          # main was descheduled past the holder's 1 ms: it never had to wait
        return trace, None
    assert len(waits) == 1, waits
    return trace, (waits[0][4] - waits[0][3]) / 1e6


def test_a_short_lock_wait_is_drawn_wide_enough_and_says_how_long_it_waited():
    # on a 2.5 s axis a 1 ms wait is under a pixel wide. (No squeezing: the sleep is the point.)
    for _ in range(6):                     # a loaded machine may stretch the wait (or skip
        trace, true_ms = _a_short_lock_wait()    # it: main came after the holder): again
        if true_ms is not None and true_ms < 3:
            break
    assert true_ms is not None, "in 6 tries main never had to wait for the holder's lock"
    fig = viz.timeline(trace, compress_idle=False)
    fig.set_dpi(100)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    boxes = [p for c in ax.collections if c.get_gid() == "lock waits" for p in c.get_paths()]
    widths = [abs(a - b) for a, b in
              (ax.transData.transform(p.vertices)[[0, 1], 0] for p in boxes)]
    assert widths and max(widths) >= MIN_PX - 1e-6, widths
    said = [t.get_text() for t in ax.texts if t.get_visible() and      # (orange: a lock's;
            t.get_text().startswith("waited ") and                         # a short join of the
            to_hex(t.get_color()) == COLORS["waiting"]]                    # thread is brown)
    lo, hi = ax.get_xlim()                                          # (in ms)
    if true_ms / (hi - lo) * ax.get_window_extent(renderer).width >= MIN_PX / 2:
        pytest.skip(f"the wait lasted {true_ms} ms six times: this machine is too loaded to "
                    f"make a wait short enough for the test's point")
    assert len(said) == 1, [t.get_text() for t in ax.texts if t.get_visible()]
    value, unit = re.search(r"([\d.]+) (µs|ms|s)\b", said[0]).groups()
    ms = float(value) * {"µs": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    assert abs(ms - true_ms) <= 0.05 * true_ms + 0.05, (said, true_ms)


# --- more real runs, from the notebooks: labels neither on each other nor on another box ----

NOTEBOOK_RUNS = {                              # scenario, its arguments (each runs in ~1 s)
    "pool-chunksize": ("pool-chunksize", {}),              # 01: Pool workers in their tasks
    "queue-sharing": ("queue-sharing", {}),                # 00, 02: main's lane full of waits
    "producer-exits": ("producer-exits", {"wait": True}),  # 01, 10: joins close together
}


def _two_async_pool_jobs():
    """Notebook 01's apply_async run: a Pool of 4, two jobs; its workers' get() waits crowd
    the lanes' starts and ends."""
    import mpviz.multiprocessing as mp
    from mpviz.examples import notebook_workers as nw
    with mt.record() as trace:
        with mp.Pool(processes=4) as pool:
            first, second = pool.apply_async(nw.add, (1, 2)), pool.apply_async(nw.add, (3, 4))
            assert (first.get(timeout=30), second.get(timeout=30)) == (3, 7)
    return trace


@pytest.fixture(scope="module")
def notebook_runs():
    out = {}
    for name, (scenario, kwargs) in NOTEBOOK_RUNS.items():
        out[name] = scenarios.run(scenario, **kwargs).trace
    out["pool-apply-async"] = _two_async_pool_jobs()
    for trace in out.values():
        drawn(trace)                            # (fonts loaded before the leak check)
    return out


def drawn_boxes(ax):
    """Every drawn box a label could hide or be mistaken for, in pixels: waits (hatched),
    Pool tasks (white), copies' red squares; [(kind, data box (x0, x1, y0, y1), pixel Bbox)]."""
    from matplotlib.transforms import Bbox
    out = []
    for c in ax.collections:
        if c.get_gid() in ("blocked", "lock waits", "tasks"):
            for path in c.get_paths():
                v = path.vertices
                data = (v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max())
                px = ax.transData.transform(v)
                out.append((c.get_gid(), data, Bbox([px.min(axis=0), px.max(axis=0)])))
        elif c.get_gid() is None and len(c.get_offsets()) and len(c.get_facecolors()) and \
                to_hex(c.get_facecolors()[0]) == COLORS["copy"]:          # copies' squares
            sizes = c.get_sizes()
            for (cx, cy), s in zip(c.get_offsets(), np.resize(sizes, len(c.get_offsets()))):
                px, py = ax.transData.transform((cx, cy))
                half = np.sqrt(s) / 2 * ax.figure.dpi / 72
                out.append(("copy", (cx, cx, cy, cy),
                            Bbox([[px - half, py - half], [px + half, py + half]])))
    return out


def test_a_label_covers_no_box_but_its_own(notebook_runs):
    # a wait's name over another wait box reads as that box's name; a short wait's "waited 2 ms"
    # over a Pool task box reads as if the worker waited the whole task
    for name, trace in notebook_runs.items():
        fig, ax, renderer = drawn(trace)
        boxes = drawn_boxes(ax)
        assert boxes, name
        for text in ax.texts:
            if not (text.get_visible() and text.get_text().strip()) or text.get_gid():
                continue
            if text in [t for t in ax.texts if t.get_text().startswith("STUCK")]:
                continue
            words = text.get_text()
            box = text.get_window_extent(renderer)
            ax_, ay = getattr(text, "xy", (None, None))
            own = [d for kind, d, _ in boxes if kind in ("blocked", "lock waits") and
                   ax_ is not None and abs(d[0] - ax_) < 1e-9 and d[2] <= ay <= d[3]]
            short = re.fullmatch(r"waited [\d.]+ (µs|ms|s)", words) is not None
            if ax_ is not None and text.get_gid() is None and text.xycoords == "data":
                at = ax.transData.transform(text.xy)[0]       # written at what it names
                assert box.x0 - 24 <= at <= box.x1 + 24, \
                    f"{name}: {words!r} ({box}) is written away from its mark at x={at:.0f}"
            for kind, d, px in boxes:
                if d in own:
                    continue
                if own and not short and kind == "tasks" and d[0] <= own[0][0] and \
                        own[0][1] <= d[1] + 1e-9:
                    continue            # a long wait's name may lie on the task it waited in
                over = (min(box.x1, px.x1) - max(box.x0, px.x0),
                        min(box.y1, px.y1) - max(box.y0, px.y0))
                assert min(over) <= 2, \
                    f"{name}: {words!r} ({box}) is drawn over a {kind} box ({px})"

        # and, as in the three runs above, every text inside the figure, none over another
        whole = fig.bbox
        boxes = [(t.get_text(), extent(t, renderer)) for t in visible_texts(fig)]
        for i, (a, box_a) in enumerate(boxes):
            assert (box_a.x0 >= whole.x0 - 1 and box_a.x1 <= whole.x1 + 1 and
                    box_a.y0 >= whole.y0 - 1 and box_a.y1 <= whole.y1 + 1), \
                f"{name}: {a!r} is drawn at {box_a}, out of the figure {whole}"
            for b, box_b in boxes[i + 1:]:
                assert not box_a.overlaps(box_b), \
                    f"{name}: {a!r} ({box_a}) is drawn over {b!r} ({box_b})"


def test_a_process_that_lived_a_few_ms_on_a_long_axis_is_drawn_wide_enough():
    # notebook 10's worker lived ~5 ms of a 2.5 s picture: narrower than a pixel, only its
    # "exit 0" was seen. (No squeezing: the sleep is the point.)
    import time
    import mpviz.multiprocessing as mp
    from mpviz.examples import notebook_workers as nw
    with mt.record() as trace:
        began = time.monotonic()
        child = mp.get_context("fork").Process(target=nw.square, args=(3,), name="brief")
        child.start()
        child.join()
        pid, lived = child.pid, time.monotonic() - began
        child.close()
        # long enough that its life, as recorded (fork to exit: about half of `lived`, which
        # counts the parent's fork and join too), is ~1.2 px of ~870 (a few ms: 1-3 s; more on
        # a loaded machine, where the child takes longer), not past 15 s
        trace.refresh()
        (life,) = [p for p in state._index(trace).procs.values() if p.pid == pid]
        recorded = (life.exit_ns - life.start_ns) / 1e9 if life.exit_ns else lived
        time.sleep(min(15.0, max(1.0, recorded * 700)))
        mt.mark("a while later")           # (the picture lasts as long as what was recorded)
    fig = viz.timeline(trace, compress_idle=False)
    fig.set_dpi(100)
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    ax = fig.axes[0]
    row = [t.get_text().split("\n")[0] for t in ax.get_yticklabels()].index("brief")
    proc = [p for p in state._index(trace).procs.values() if p.pid == pid][0]
    lo, hi = ax.get_xlim()
    true_px = (proc.exit_ns - proc.start_ns) / 1e6 / (hi - lo) * ax.get_window_extent().width
    if true_px >= MIN_PX - 0.5:
        pytest.skip(f"the child lived {lived * 1e3:.0f} ms ({true_px:.1f} px of the picture): "
                    f"this machine is too loaded to make a process that short")
    lives = [c for c in ax.collections if c.get_gid() == "lives"]
    widths = [abs(v[:, 0].max() - v[:, 0].min()) for c in lives for p in c.get_paths()
              for v in [ax.transData.transform(p.vertices)]
              if row - 0.5 < p.vertices[:, 1].mean() < row + 0.5]
    assert widths and max(widths) >= MIN_PX - 1e-6, widths
