"""Notebook 10's programs behave as its text says, traced through the real CLI.

The notebook runs these under nbval, which checks that its cells run, not what they print;
these tests check the facts the text states: which programs hang, the exit status, the line
the verdict names, who the words and the wait-for graph say must act, and how many fds torch
hands over under each strategy.
"""
import importlib.util

import pytest
from matplotlib.colors import to_hex

from mpviz.examples.your_program import HANG_STATUS, trace_program


@pytest.fixture(scope="module", autouse=True)
def _fonts(fonts_loaded):
    """(see conftest.fonts_loaded)"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """trace_program(script, *args, hang_after=...), run once per module for the same
    arguments: several tests read the same run (torch_queue.py file_descriptor three times,
    hang_join.py and hang_task_done.py twice), each only reading its trace and words."""
    runs = {}

    def run(script, *args, hang_after):
        key = (script, args, hang_after)
        if key not in runs:
            runs[key] = trace_program(script, *args, hang_after=hang_after,
                                      directory=str(tmp_path_factory.mktemp("traced")))
        return runs[key]
    return run


@pytest.mark.parametrize("script, args, status, own_line, must_act", [
    ("hang_join.py", (), HANG_STATUS, "main (hang_join.py:28)",
     "Process-1's main thread must exit"),
    ("hang_join.py", ("--fix",), 0, None, None),
    ("hang_task_done.py", (), HANG_STATUS, "main (hang_task_done.py:31)",
     "Process-1's main thread must call task_done()"),
    ("hang_task_done.py", ("--fix",), 0, None, None),
])
def test_programs_hang_or_end_as_the_notebook_says(script, args, status, own_line, must_act,
                                                   traced):
    run = traced(script, *args, hang_after=2)
    assert run.status == status, run.messages
    assert run.hung == (status == HANG_STATUS), run.messages
    if own_line:
        assert own_line in run.messages
        # The waits were recorded (the timeline draws them): the words must say so.
        assert "recorded no wait" not in run.messages
        assert must_act in run.messages


def test_the_join_hang_in_words_names_every_wait_of_the_chain(traced):
    run = traced("hang_join.py", hang_after=2)
    words = run.messages
    assert "hang_join.py's main thread waits: join Process-1" in words
    assert ("Process-1's QueueFeederThread waits: write 4 MiB into the full pipe of Queue 1 -- "
            "someone must read Queue 1, and nobody has read it yet") in words
    assert "Process-1's main thread waits: join thread QueueFeederThread" in words
    import mpviz.viz as viz
    fig = viz.wait_for(run.trace)
    texts = [t.get_text() for t in fig.axes[0].texts]
    # the queue is named as on the timeline ("Queue 1"), not by its internal id
    assert any(t.startswith("Queue 1\npipe full") for t in texts), texts
    assert not any("sem-" in t for t in texts), texts
    # the timeline: the ✗ beside the blocked write is written whole, clear of the STUCK box's
    # border (it was pushed flush against the axes' edge, its ✗ drawn on that border)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import Rectangle
    from mpviz.viz.colors import COLORS
    fig = viz.timeline(run.trace)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, ax = canvas.get_renderer(), fig.axes[0]
    frames = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill() and
              to_hex(p.get_edgecolor()) == COLORS["deadlock"]]
    assert len(frames) == 2                              # both processes stuck for good
    border = max(ax.transData.transform((p.get_x(), 0))[0] + p.get_linewidth() * renderer.dpi
                 / 72 / 2 for p in frames)               # the right side of the left border
    (cross,) = [t for t in ax.texts if t.get_text().startswith("✗ write blocked: pipe full")]
    assert cross.get_visible()
    for text in ax.texts:
        if text.get_visible() and text.get_text().strip():
            assert text.get_window_extent(renderer).x0 > border, text.get_text()
    # waits never satisfied end with their killed processes: a launcher that reaps them 10 s
    # later (a slow machine) adds a stretch where nothing was recorded, squeezed, not 10 s of
    # hatching that never happened
    import mpviz.trace as mt
    from mpviz.trace.events import Event
    last = run.trace.events[-1]
    late = Event(last.ts_ns + 10**10, last.pid, last.tid, "mark", {"name": "late"})
    fig = viz.timeline(mt.Trace(events=list(run.trace.events) + [late]))
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    squeezed = [float(t.split("+")[1].split()[0]) for t in ticks if t.startswith("≈")]
    assert squeezed and squeezed[-1] >= 10.0, ticks        # (with the reaping's own delay)


def test_the_joinable_queue_is_named_as_on_the_timeline(traced):
    run = traced("hang_task_done.py", hang_after=2)
    import mpviz.viz as viz
    texts = [t.get_text() for t in viz.wait_for(run.trace).axes[0].texts]
    assert any(t.startswith("Queue 1 (a JoinableQueue)") for t in texts), texts


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("strategy, fds", [("file_descriptor", 4), ("file_system", 0)])
def test_torch_queue_segments_and_fds(strategy, fds, traced):
    run = traced("torch_queue.py", strategy, hang_after=0)
    assert run.status == 0, run.messages
    segments = [s for s in run.trace.segments() if s.name.startswith("/torch_")]
    assert len(segments) == 4 and {s.nbytes for s in segments} == {256 * 1024}
    assert {s.strategy for s in segments} == {strategy}
    assert sum(e.kind == "fd.send" for e in run.trace.events) == fds
    # the notebook: "Four messages: the four handles on the queue. The four requests for a
    # descriptor ... are not among them", and the torch: line counts them
    import mpviz.viz as viz
    summary = viz.summary(run.trace)
    assert summary.splitlines()[1].startswith("4 messages: 4 carried shared-memory handles"), \
        summary
    assert (f"{fds} fds handed over ({fds} asked for by a request of " in summary) == bool(fds)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_memory_map_does_not_claim_torch_still_maps_a_segment(traced):
    """torch unmaps a storage in C++ (a consumer's `del t`), which no hook sees: the map must
    not say "maps it" of a torch segment, only that it was mapped and the unmap is unseen."""
    import mpviz.viz as viz
    run = traced("torch_queue.py", "file_descriptor", hang_after=0)
    last_attach = max(e.ts_ns for e in run.trace.events if e.kind == "shm.attach")
    fig = viz.memory_map(run.trace, at=last_attach)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert not any("maps it" in t for t in texts), texts
    assert sum("mapped it\n(unmap not seen)" in t for t in texts) == 8, texts  # 4 × 2 processes
    assert texts.count("in use, unless torch\nhas let go (unseen)") == 4, texts


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_an_event_is_named_event_1_not_by_its_internal_id(traced):
    """torch_queue.py's producer waits on an Event: the timeline's label and the state's words
    call it "Event 1", as a queue is "Queue 1", never "event sem-7f…"."""
    import mpviz.viz as viz
    run = traced("torch_queue.py", "file_descriptor", hang_after=0)
    texts = [t.get_text() for t in viz.timeline(run.trace).axes[0].texts]
    begin = next(e for e in run.trace.events if e.kind == "wait.begin" and e.args["on"] == "event")
    end = next(e for e in run.trace.events if e.kind == "wait.end" and e.pid == begin.pid
               and e.tid == begin.tid and e.ts_ns >= begin.ts_ns)
    # its label, or -- when the consumer had set the Event before the producer reached wait()
    # (seen once in CI), a wait too short to hold words -- its true length, "waited 85 µs"
    from mpviz.viz.timeline import _duration
    short = f"waited {_duration(end.ts_ns - begin.ts_ns)}"
    assert "waited: Event 1.wait()" in texts or short in texts, (short, texts)
    assert not any("sem-" in t for t in texts), texts
    state = viz.state_at(run.trace, begin.ts_ns + 1)
    assert [b.what for b in state.blocked if b.on == "event"] == ["Event 1.wait()"]


def test_notebook_10_runs_no_solution_and_its_solutions_file_answers_both_exercises():
    import json
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "notebooks", "10_your_own_program.ipynb")) as f:
        cells = json.load(f)["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not [s for s in code if s.lstrip().startswith("# Solution")]       # not under Run All
    assert not [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]
    assert sum(s.strip() == "# Your code here" for s in code) == 2
    with open(os.path.join(root, "notebooks", "solutions", "10_your_own_program.md")) as f:
        answers = f.read()
    assert 'trace_program("hang_task_done.py", "--fix")' in answers
    assert "check_handovers(fs, 0)" in answers
