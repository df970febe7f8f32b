"""The Live widget, driven from a test as a notebook user would: Run, wait, scrub, read panels.

Nothing here needs a browser: Play and the slider are linked kernel-side (``widgets.link``), so
setting ``slider.value`` is exactly what dragging it does, and every panel is a widget whose
``value`` (HTML) or ``outputs`` (the picture) the test can read.
"""
import base64
import functools
import io
import os
import sys
import time

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

pytest.importorskip("ipywidgets")

sys.path.insert(0, os.path.dirname(__file__))
import viz_workers as w  # noqa: E402

import mpviz.multiprocessing as mp  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.widgets import Live  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def widgets_closed():
    """Each test's widgets are closed at its end, as a notebook's kernel shutdown would: ipywidgets
    keeps every open widget in its registry (and a Live's buttons keep the Live, by their
    callbacks), and so whatever the Live's work holds -- a multiprocessing Event, whose slots
    are two fds -- would outlive the test, and the leak check would count them."""
    yield
    import ipywidgets
    ipywidgets.Widget.close_all()


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded():
    """matplotlib keeps a font file open once it has used it: load them before the leak check."""
    live = Live(w.producer_consumer)
    live.run()
    assert live.wait(120)
    for which in ("timeline", "memory map", "wait-for"):
        live.which.value = which
    fig = viz.timeline(live.trace, fast=True)
    fig.savefig(io.BytesIO(), format="png", dpi=60)


def png_of(live):
    (out,) = live.picture.outputs
    return base64.b64decode(out["data"]["image/png"])


def test_run_wait_scrub_and_read_the_panels():
    live = Live(w.producer_consumer, start_method=["spawn", "fork"], n=3)
    assert list(live.controls) == ["start_method", "n", "size", "big"]
    assert live.controls["start_method"].options == ("spawn", "fork")
    live.run()
    assert live.wait(120), "the run finished and the scrubber is ready"
    assert live.result.outcome == "ok"
    assert "the consumer summed 300000" in live.verdict.value
    assert live.slider.max == len(live.instants) - 1 > 10 and not live.slider.disabled

    # an instant when the producer has put its first tensor and the consumer has not got it
    trace = live.trace
    producer = next(p.pid for p in trace.processes() if p.name == "producer")
    first = next(f for f in trace.flows() if f.put.pid == producer)
    live.show(first.put.ts_ns)
    assert live.instants[live.slider.value] == first.put.ts_ns
    panel = live.state_panel.value
    assert f"producer (pid {producer})" in panel and "Messages in flight (1)" in panel
    assert "mpviz_fd_" in panel and "file_descriptor" in panel     # the shared segment
    assert live.play.value == live.slider.value                       # linked, kernel side
    assert png_of(live).startswith(b"\x89PNG")

    live.which.value = "memory map"                  # the picture follows the chooser
    assert png_of(live).startswith(b"\x89PNG")
    live.play.value = live.slider.max                 # Play drives the slider too
    assert live.slider.value == live.slider.max
    assert "Processes alive (1)" in live.state_panel.value


def test_redraws_from_the_recorder_while_running():
    ctx = mp.get_context("fork")
    release = ctx.Event()
    live = Live(functools.partial(w.wait_in_a_child, release))
    live.run()
    start = time.monotonic()
    deadline = start + 60
    while live.refreshes < 12 and time.monotonic() < deadline:
        assert live.running
        live._stop.wait(0.05)      # polling the widget's own counters, bounded
    elapsed = time.monotonic() - start
    rate = live.refreshes / elapsed
    frames = live.frames
    release.set()
    assert live.wait(60)
    assert rate >= 5, f"recorder read {rate:.1f} times a second"
    assert frames >= 2, "the picture was redrawn while the work ran"
    assert "waiter" in live.state_panel.value or live.result.outcome == "ok"
    assert live.result.outcome == "ok" and "exit code 0" in live.result.explanation


def test_stop_kills_the_work():
    ctx = mp.get_context("fork")
    never = ctx.Event()
    live = Live(functools.partial(w.wait_in_a_child, never))
    live.run()
    deadline = time.monotonic() + 30
    while not any(e.kind == "mark" for e in live.trace.snapshot().events):
        assert time.monotonic() < deadline, "the child never recorded that it is waiting"
        time.sleep(0.01)   # a poll of what Live's own poller reads (it alone refreshes the trace)
    live.stop()
    assert live.wait(60)
    assert live.result.outcome == "stopped"
    assert "STOPPED" in live.verdict.value


def test_an_exception_is_the_verdict():
    def broken(n=1):
        raise ValueError(f"bad n={n}")
    live = Live(broken, n=7)
    live.run()
    assert live.wait(60)
    assert live.result.outcome == "error" and "bad n=7" in live.result.explanation


def test_bad_targets_say_what_is_wrong():
    with pytest.raises(TypeError, match="scenario name"):
        Live(42)


def test_a_scenario_target():
    live = Live("queue-sharing")
    live.run()
    assert live.wait(150)
    assert live.result.outcome in ("ok", "warning")
    assert live.slider.max > 0
    live.slider.value = live.slider.max // 2
    assert "Processes alive" in live.state_panel.value


def test_live_is_a_widget_that_goes_in_a_box():
    """Live is an ipywidgets VBox: it can sit in an HBox (two runs side by side), a Tab, Voilà,
    and displays through the widget protocol, with its parts and attributes as before."""
    import ipywidgets as widgets
    left, right = Live(w.producer_consumer, start_method="fork"), Live("queue-sharing")
    assert isinstance(left, widgets.VBox) and left.box is left
    row = widgets.HBox([left, right])                      # a TraitError if Live is no widget
    assert row.children == (left, right)
    bundle = left._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == left.model_id
    assert left.run_button in left.children[2].children and left.picture in left.children
    assert "mpviz-live" in left._dom_classes
    left.run()
    assert left.wait(120) and left.result.outcome == "ok"
    assert "Processes alive" in left.state_panel.value
    row.close()


def test_state_before_run_says_what_to_do():
    live = Live(w.producer_consumer)
    with pytest.raises(RuntimeError, match="nothing has run yet.*Fix: press Run"):
        live.state()
    live.run()
    assert live.wait(120)
    assert live.state().t_s >= 0


def test_live_stepped_is_the_stepping_widget_in_a_vbox():
    """Live(..., stepped=True): the parts of mpviz.widgets.Stepper (one button per choice, Undo,
    the wait-for graph), in the Live itself -- still an ipywidgets VBox; clicks step the run."""
    import ipywidgets as widgets
    from mpviz.trace import session
    from mpviz.scenarios.puzzles import PUZZLES
    live = Live("lock-order", stepped=True)
    try:
        assert isinstance(live, widgets.VBox) and live.box is live
        assert "mpviz-stepper" in live._dom_classes
        assert live.stepping.box is live and live.stepping.buttons in live.children
        assert [b.description for b in live.stepping.buttons.children] == \
            ["main/main: start process child"]
        for step in PUZZLES["lock-order"].goal_schedule:
            live.click(step)
        assert live.stepper.outcome == "deadlock"
        assert "outcome: deadlock" in live.stepping.outcome.value
        assert dict(live.state().threads)["child/main"] == \
            "blocked in: acquire lock A (held by main/main)"
        assert "stepped: deadlock" in repr(live)
        with pytest.raises(RuntimeError, match=r"stepped=True\)\.run\(\).*Fix: click"):
            live.run()
        sid = live.stepper._proc.pid
    finally:
        live.close()                   # ends the run's processes, then closes the widget
    assert session.session_pids(sid) == []
    with pytest.raises(RuntimeError, match="only a stepped Live.*Fix: Live"):
        Live(w.producer_consumer).click(0)
    with pytest.raises(ValueError, match="the puzzles are"):
        Live("no-such-puzzle", stepped=True)


def test_the_widgets_colour_key_names_what_the_timeline_draws_today():
    # the hatched waits and the dashed fd arrows were drawn but missing from the widget's key
    from mpviz.viz.colors import WORDS
    from mpviz.widgets import _legend_html
    import html
    key = _legend_html()
    for what in ("blocked", "fd", "handle", "copy", "waiting", "holding", "leak", "deadlock"):
        assert html.escape(WORDS[what]) in key, what
    # the fd swatch is a dashed line wide enough to see its gaps (a 12 px border-top showed
    # one dash and looked solid)
    import re
    fd = key[:key.index(html.escape(WORDS["fd"]))].rsplit("<span", 1)[-1]
    assert re.search(r"<svg width='(\d+)'.*stroke-dasharray='(\d+),(\d+)'", fd), fd
    width, on, off = map(int, re.search(r"<svg width='(\d+)'.*stroke-dasharray='(\d+),(\d+)'",
                                        fd).groups())
    assert width >= 2 * (on + off) + on, (width, on, off)     # at least three dashes show
