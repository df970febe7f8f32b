"""The wait-for graph's arrows go from the box that must act to the box that waits, and pass
through no other box: a line that crosses a box reads as coming from it.

The program is a hand-rolled DataLoader, written as its author would: each worker gets indices
from a queue of its own and puts results into one shared queue. Between two batches the main
thread waits for the shared queue while the workers that are done wait for their index queues
-- waits that go round (main -> index queues -> workers -> data queue -> main) without being a
deadlock. The graph of such a moment once drew the main thread's arrow to "worker 0's index
queue" straight through worker 2's box; with eight workers, a fan of straight arrows from the
main thread to eight index queues cut the corners of the boxes beside the one each points at.
"""
import multiprocessing

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402
from matplotlib.path import Path  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.trace import analysis as st  # noqa: E402

pytestmark = pytest.mark.timeout(120)
WORKERS, STEPS = 8, 3


def work(index_queue, data_queue):
    while True:
        i = index_queue.get()
        if i is None:
            break
        data_queue.put(i * i)


def _pipeline():
    ctx = multiprocessing.get_context("fork")
    with mt.record() as trace:
        index_queues = [ctx.Queue() for _ in range(WORKERS)]
        data_queue = ctx.Queue()
        workers = [ctx.Process(target=work, args=(q, data_queue)) for q in index_queues]
        for p in workers:
            p.start()
        total = 0
        for step in range(STEPS):
            for i, q in enumerate(index_queues):
                q.put(step * WORKERS + i)
            total += sum(data_queue.get() for _ in range(WORKERS))
        for q in index_queues:
            q.put(None)
        for p in workers:
            p.join()
    assert total == sum(i * i for i in range(WORKERS * STEPS))
    return trace, {p.pid for p in workers}


def _round_moment(trace, workers):
    """An instant at which the main thread waits for the data queue and at least two workers
    wait for their index queues (the waits go round), the most such workers first."""
    best, most = None, 1
    for e in trace.of_kind("wait.begin"):
        blocked = st.state_at(trace, e.ts_ns).blocked
        main = [b for b in blocked if b.pid not in workers and b.on == "queue.get"]
        idle = [b for b in blocked if b.pid in workers and b.on == "queue.get"]
        if main and len(idle) > most:
            best, most = e.ts_ns, len(idle)
    return best


def _crossings(fig):
    """(arrow's words, box crossed) for each arrow whose drawn line passes through a box that is
    neither of its two ends."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    boxes = [(t, t.get_bbox_patch()) for t in ax.texts if t.get_bbox_patch() is not None]
    out = []
    for arrow in [p for p in ax.patches if isinstance(p, FancyArrowPatch)]:
        path = ax.transData.transform_path(arrow.get_path())
        lines = [Path(poly) for poly in path.to_polygons(closed_only=False)]
        for text, patch in boxes:
            if patch is arrow.patchA or patch is arrow.patchB:
                continue
            bbox = patch.get_window_extent(renderer)
            if any(line.intersects_bbox(bbox, filled=False) for line in lines):
                ends = [t.get_text() for t, p in boxes if p in (arrow.patchA, arrow.patchB)]
                out.append((" -> ".join(ends), text.get_text()))
    return out


def test_a_round_of_waits_is_drawn_with_no_arrow_through_another_box(fonts_loaded):
    trace, workers = _pipeline()
    at = _round_moment(trace, workers)
    assert at is not None, "no instant where the main thread and two workers waited at once"
    state = st.state_at(trace, at)
    assert not state.deadlocks                   # it goes round, but nobody is stuck
    fig = viz.wait_for(trace, at=at)
    arrows = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
    must_put = [t for t in fig.axes[0].texts if t.get_text() == "must put"]
    assert len(arrows) >= 5 and must_put       # main -> 2 queues -> 2 workers, workers -> data
    assert _crossings(fig) == []
