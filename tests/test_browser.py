"""The workshop as a person sees it: JupyterLab in headless Chromium, Run All, click Live's Run.

The tests share one JupyterLab server (127.0.0.1, a random port and token, private Jupyter
config/runtime/data dirs; its log in ``artifacts/browser/test_browser-server/``) in the project's
environment, and one Debian Chromium driven through Playwright. Each test serves a temp copy of
its notebook's directory with outputs cleared, opens it in a browser context of its own (in Lab,
a workspace of its own) with a kernel of its own, runs all cells from the Run menu, and then works the Live widget: Run → wait for the verdict → drag the
time slider → Play. It asserts that the widget rendered (a picture, a verdict, a state panel whose
text changes with the slider) and that no cell shows an error. Screenshots of each moment go to
``artifacts/browser/<test>/NN-<moment>.png`` (with the server's log and the browser console);
``MPVIZ_README_SHOT=1`` also copies the Live widget's picture from the 00_overview test to
``docs/images/live_widget.png``.

``test_notebook7_live`` does the same with 00_overview in Notebook 7 (``/notebooks/NB.ipynb``, served
by the same server: the ``notebook`` package of the browser extra), and checks that the widget and
its picture have a real size and stay inside their cell.

Chromium: Debian's package ``chromium`` (``/usr/bin/chromium``, or ``MPVIZ_CHROMIUM``), never
Playwright's download; ``./run test`` installs it with apt-get when it can. Without it these tests
FAIL and say how to install it; ``MPVIZ_SKIP_BROWSER=1`` skips them on purpose.
``pytest -m "not browser"`` deselects them.

The CSS class contract with ``mpviz.widgets.Live`` (ipywidgets 8 ``add_class``):

    ========================  =========================================================
    ``mpviz-live``            the widget's root (a Box)
    ``mpviz-run``             its Run button
    ``mpviz-verdict``         the verdict area: empty (or unchanged) until a run ends
    ``mpviz-state``           the state panel: its text describes the slider's time
    ``mpviz-slider``          the time slider (IntSlider/FloatSlider/SelectionSlider)
    ``mpviz-play``            the Play widget, linked to the slider
    ``.widget-output img``    the picture: a matplotlib figure shown in an Output widget
    ========================  =========================================================

Cleanup: after each test its browser context is closed and its kernel shut down through the
server's API; every process the test started carries ``MPVIZ_BROWSER_TAG`` in its environment
(the kernel, what the kernel starts), and the fixture fails the test if any of them is still
running 15 s later (and kills it). conftest's leak check runs after each test as usual (no
/dev/shm/mpviz_* left, no new fds, no live children but the shared server and Playwright driver).
At the module's end the server gets SIGTERM and the browser is closed, and the same 15 s check
covers them and everything they started (Chromium carries a tag of its own).
"""
import contextlib
import os
import shutil
import sys

import pytest

import conftest
from browser.harness import SharedLab, skip_if_asked
from browser.live import LiveWidget

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the tests then fail in SharedLab.start, saying how to install it
    PlaywrightTimeout = TimeoutError

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
ARTIFACTS = os.path.join(ROOT, "artifacts", "browser")
README_SHOT = os.path.join(ROOT, "docs", "images", "live_widget.png")
FIXTURE = os.path.join(TESTS, "browser", "fixture.ipynb")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    """One JupyterLab server and one Chromium for this module's tests (each starts in seconds,
    and every test would start the same): a SharedLab. At the end both are stopped, and nothing
    they started may still be running."""
    skip_if_asked()
    before = set(conftest.children())
    lab = SharedLab(os.path.join(ARTIFACTS, "test_browser-server"),
                    tmp_path_factory.mktemp("lab")).start()
    kept = set(conftest.children()) - before   # the server and Playwright's driver
    conftest.KEPT_ALIVE.update(kept)           # the leak check after each test lets these live
    yield lab
    problems = lab.close()
    conftest.KEPT_ALIVE.difference_update(kept)
    if problems:
        pytest.fail("the shared JupyterLab server and browser did not stop cleanly:\n  " +
                    "\n  ".join(problems), pytrace=False)


@pytest.fixture
def lab(request, shared_lab):
    """A LabTest on the shared server and browser: nothing of it starts until
    ``lab.open_notebook(path)``; after the test its kernel is shut down and must be gone."""
    name = request.node.name.replace("[", "-").replace("]", "")   # test_x[a] -> test_x-a
    test = shared_lab.test(os.path.join(ARTIFACTS, name))
    yield test
    problems = test.close()
    if problems:
        pytest.fail("the browser test did not stop cleanly:\n  " + "\n  ".join(problems),
                    pytrace=False)


def workshop_notebook(name):
    """notebooks/<name>.ipynb, or a failure saying it is not there (the notebooks are written
    alongside this suite; until they land these tests fail, on purpose, rather than skip)."""
    path = os.path.join(ROOT, "notebooks", f"{name}.ipynb")
    if not os.path.isfile(path):
        pytest.fail(f"notebook not found: notebooks/{name}.ipynb -- the browser test opens it in "
                    f"JupyterLab and works its Live widget; it fails until the notebook exists.",
                    pytrace=False)
    return path


def assert_no_cell_errors(nb, when, widget_callbacks=False):
    """No cell shows an error; with `widget_callbacks`, no widget callback raised either (those
    exceptions go to Lab's log console, which this opens: do it last, it changes the layout)."""
    errors = nb.errors()
    if widget_callbacks:
        errors += [f"a widget callback raised (Lab's log console): …{text[-500:]}"
                   for text in nb.logged_exceptions()]
    assert not errors, f"{when}, {nb.name} shows errors:\n  " + "\n  ".join(errors)


@contextlib.contextmanager
def should(what):
    """Turn a Playwright timeout inside into an assertion that says what was expected."""
    try:
        yield
    except PlaywrightTimeout as e:
        raise AssertionError(f"expected {what}, but it did not happen in time ({e})") from None


def exercise_live(lab, nb, live, label):
    """Run → verdict → slider → Play, with a screenshot at each moment. Returns the verdict."""
    live.click_run()
    lab.screenshot(f"{label}-running")
    try:
        verdict = live.wait_verdict()
    except PlaywrightTimeout as e:
        log = "\n".join(f"[{level}] {text}" for level, text in nb.log_console())
        raise AssertionError(f"no verdict appeared after Run ({e}); Lab's log console says:\n"
                             f"{log or '(nothing)'}") from None
    lab.screenshot(f"{label}-verdict")
    assert live.picture().is_visible(), "the widget shows no picture (.widget-output img) after Run"
    assert live.picture().evaluate("img => img.complete && img.naturalWidth > 0"), \
        "the widget's picture is an empty or broken image"

    state_before, value_before = live.text("state"), live.slider_value()
    live.move_slider(0.25)
    with should(f"the slider to move from {value_before} when dragged to 1/4"):
        value_quarter = live.wait_slider_change(value_before)
    with should(f"the state panel to change when the slider moved to {value_quarter}"):
        live.wait_state_change(state_before)
    lab.screenshot(f"{label}-slider-quarter")
    live.move_slider(0.75)
    with should(f"the slider to move from {value_quarter} when dragged to 3/4"):
        live.wait_slider_change(value_quarter)
    lab.screenshot(f"{label}-slider-three-quarters")

    play_from = live.slider_value()
    live.toggle_play()                                  # play
    with should(f"Play to move the slider from {play_from}"):
        live.wait_slider_change(play_from)
    live.toggle_play()                                  # pause
    lab.screenshot(f"{label}-after-play")
    assert live.picture().is_visible(), "the picture disappeared while scrubbing"
    return verdict


def test_fixture_notebook(lab):
    """The machinery itself, on a stand-in widget with Live's DOM shape (tests/browser/fixture.ipynb)."""
    nb = lab.open_notebook(FIXTURE, copy_dir=False)
    lab.screenshot("opened")
    nb.run_all()
    lab.screenshot("after-run-all")
    assert_no_cell_errors(nb, "after Run All")
    outputs = nb.page.locator(".jp-OutputArea-output").all_inner_texts()
    assert any(f"kernel environment: {sys.prefix}" in t for t in outputs), \
        f"the kernel does not run in the project's environment ({sys.prefix}): {outputs[:3]}"

    live = LiveWidget.find(nb.page, also="fixture-live")
    assert live.picture().is_visible(), "the stand-in shows no picture before Run"
    verdict = exercise_live(lab, nb, live, "fixture")
    assert "ok" in verdict
    lab.screenshot("widget", live.root)
    assert_no_cell_errors(nb, "after working the widget", widget_callbacks=True)


@pytest.mark.parametrize("name", ["00_overview", "04_fork_deadlocks"])
def test_workshop_notebook_live(lab, name):
    """A workshop notebook: every cell runs without error, and its (first) Live widget works."""
    path = workshop_notebook(name)
    nb = lab.open_notebook(path)
    nb.run_all()
    lab.screenshot("after-run-all")
    assert_no_cell_errors(nb, "after Run All")

    with should("a Live widget in the page, found by its class mpviz-live (mpviz.widgets.Live "
                "must add the CSS classes listed in tests/test_browser.py's docstring)"):
        live = LiveWidget.find(nb.page)
    exercise_live(lab, nb, live, "live")
    widget_shot = lab.screenshot("widget", live.root)
    if name == "00_overview" and os.environ.get("MPVIZ_README_SHOT") == "1":
        os.makedirs(os.path.dirname(README_SHOT), exist_ok=True)
        shutil.copyfile(widget_shot, README_SHOT)
    assert_no_cell_errors(nb, "after working the Live widget", widget_callbacks=True)


def notebook7_or_fail():
    """Notebook 7 (the ``notebook`` package, >= 7) is in the browser extra; without it this fails,
    saying so, like the rest of the suite does without Chromium or Playwright."""
    try:
        from importlib.metadata import version
        found = version("notebook")
    except Exception:  # noqa: BLE001 -- PackageNotFoundError, or broken metadata
        found = None
    if found is None or int(found.split(".")[0]) < 7:
        pytest.fail(f"Notebook 7 is needed (found notebook {found}): install the browser extra, "
                    f"`pip install -e '.[browser]'` (./run test does).", pytrace=False)


def assert_layout_fits(nb, live):
    """The widget laid out sanely: it and its picture have a real size, and neither spills out of
    the notebook's cell area sideways (what a broken flex layout or a fixed-width figure does)."""
    with should("the widget's picture drawn within 30 s of the widget showing (on a loaded "
                "machine the first frame arrives after the widget's frame)"):
        live.picture().wait_for(state="visible", timeout=30_000)
    box = live.root.bounding_box()
    cell = nb.page.locator(".jp-Cell.jp-CodeCell", has=live.root).first.bounding_box()
    for _ in range(100):   # each frame replaces the picture: a new <img> has no size until decoded
        pic = live.picture().bounding_box()
        if pic is not None:
            break
        nb.page.wait_for_timeout(100)   # (bounded: 10 s in all)
    assert box and box["width"] > 200 and box["height"] > 100, f"the widget is squashed: {box}"
    assert pic and pic["width"] > 100 and pic["height"] > 50, \
        f"the picture is squashed, or had no size for 10 s (frames kept replacing it): {pic}"
    assert cell is not None, "the widget is not inside a notebook cell"
    for what, b in [("widget", box), ("picture", pic)]:
        assert b["x"] >= cell["x"] - 1 and b["x"] + b["width"] <= cell["x"] + cell["width"] + 1, \
            f"the {what} ({b}) spills out of its cell ({cell})"


def test_notebook7_live(lab):
    """00_overview in Notebook 7 (the issue: the widget must work and look right in JupyterLab 4
    *and* Notebook 7): Run All from Notebook 7's Run menu, no cell errors, Live works, sane layout."""
    notebook7_or_fail()
    path = workshop_notebook("00_overview")
    nb = lab.open_notebook(path, flavour="notebook")
    lab.screenshot("opened")
    nb.run_all()
    lab.screenshot("after-run-all")
    assert_no_cell_errors(nb, "after Run All in Notebook 7")

    with should("a Live widget in the Notebook 7 page, found by its class mpviz-live"):
        live = LiveWidget.find(nb.page)
    exercise_live(lab, nb, live, "live")
    assert_layout_fits(nb, live)
    lab.screenshot("widget", live.root)
    assert_no_cell_errors(nb, "after working the Live widget in Notebook 7", widget_callbacks=True)
