"""``Live``: run a scenario (or your own function), watch it while it runs, then scrub through it.

    from mpviz.widgets import Live
    Live("fork-held-lock")                         # a scenario: its parameters become controls
    Live(my_function, start_method=["fork", "spawn"], n=3)   # your function: its arguments
    Live("lock-order", stepped=True)               # be the scheduler: one button per choice
                                                   # (the same parts as mpviz.widgets.Stepper)

    ┌ controls (start method, strategy, …) ─ [Run] [Stop] ──────────────────────────────┐
    │ picture: the timeline, redrawn from the recorder while the work runs (~8 per second) │
    │ afterwards: [▶ Play] ──○────────── slider = an instant; the picture shows it          │
    │ panels at that instant: processes alive · shared memory · locks · messages in flight │
    │ verdict: ok / deadlock / error / warning / leak, and why                             │
    └───────────────────────────────────────────────────────────────────────────────────────┘

How it works. Run starts the work without blocking the kernel: a scenario through
``mpviz.scenarios.start`` (its own driver process and watchdog), a callable in a background
thread inside ``mpviz.trace.record(dir)``. A poll thread reads the trace directory
(``Trace.refresh()``) every 1/8 s and redraws. Pictures are rendered to PNG and put straight into
an ``Output`` widget's ``outputs`` (not ``with out: display(fig)``, which from a thread -- and
under nbval -- lands in the wrong cell). Play is tied to the slider with ``widgets.link``, which
runs in the kernel, so a test can drive everything by setting ``slider.value`` (``jslink`` would
only link them in a browser). Everything the panels say comes from ``mpviz.viz.state_at``.
"""
import base64
import html
import inspect
import io
import multiprocessing
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

import mpviz.trace as mt
from mpviz import _tempdirs
from mpviz import viz
from mpviz.trace.names import human_bytes
from mpviz.viz.colors import BLOCKED_FILL, COLORS, WORDS

REFRESH_HZ = 8
_RENDERER = None                     # one long-lived drawing thread (see _render_in_background)
MAX_STEPS = 400                      # slider positions at most (instants subsampled evenly)


@dataclass
class LiveResult:
    """What a run of a callable ended with (the same fields as ``mpviz.scenarios.Result``)."""
    name: str
    params: dict
    trace: Any
    outcome: str                     # ok, deadlock, error, warning, leak, stopped
    explanation: str
    duration_s: float


class Live(widgets.VBox):
    """An ipywidgets app for one scenario name or callable; display it (last line of a cell).

    It is itself a widget (a ``VBox`` of its parts), so it also goes wherever a widget goes: an
    ``HBox`` beside another ``Live``, a ``Tab``, a Voilà dashboard.

    Attributes tests and notebooks use: ``controls`` (name → widget), ``run_button``,
    ``stop_button``, ``play``, ``slider``, ``picture`` (Output), ``which`` (the picture chooser),
    ``state_panel`` and ``verdict`` (HTML), ``frames`` (pictures drawn so far), ``result``,
    ``trace``; methods ``run()``, ``stop()``, ``wait(timeout)``, ``show(t_ns)``, ``state()``.

    ``Live(target, stepped=True, **params)``: be the scheduler instead (see ``_init_stepped``):
    ``stepping`` (the ``mpviz.widgets.Stepper`` whose parts it shows), ``stepper`` (the run),
    ``click(choice)``, ``state()``, ``close()`` (ends the run's processes, then the widget).
    """

    def __init__(self, target, stepped=False, **controls):
        if not (isinstance(target, str) or callable(target)):
            raise TypeError("Live(target): target is a scenario name (str) or a callable, not "
                            f"{type(target).__name__}")
        self.target = target
        self.name = target if isinstance(target, str) else getattr(target, "__name__", "work")
        self.stepping = None
        if stepped:
            self._init_stepped(target, controls)
            return
        self.controls = self._make_controls(target, controls)
        self.trace, self.result, self.frames, self.refreshes = None, None, 0, 0
        self.instants = []
        self._running = None                  # scenario Running, or the callable's thread
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._draw_lock = threading.Lock()
        self._poller = None
        self._snapshot = None

        self.run_button = widgets.Button(description="Run", button_style="success", icon="play")
        self.stop_button = widgets.Button(description="Stop", button_style="danger",
                                          icon="stop", disabled=True)
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.play = widgets.Play(min=0, max=0, step=1, interval=250, disabled=True,
                                 description="Play")
        self.slider = widgets.IntSlider(min=0, max=0, description="instant", disabled=True,
                                        continuous_update=True,
                                        layout=widgets.Layout(width="60%"))
        widgets.link((self.play, "value"), (self.slider, "value"))   # kernel side, not jslink
        self.slider.observe(self._on_slider, names="value")
        self.when = widgets.HTML("")
        self.which = widgets.ToggleButtons(options=["timeline", "memory map", "wait-for"],
                                           value="timeline", style={"button_width": "110px"})
        self.which.observe(lambda _: self._redraw_scrub(), names="value")
        self.picture = widgets.Output(layout=widgets.Layout(min_height="160px"))
        self.state_panel = widgets.HTML("<i>Press Run.</i>")
        self.verdict = widgets.HTML("")
        self.legend = widgets.HTML(_legend_html())
        super().__init__([
            widgets.HTML(f"<b>{html.escape(self.name)}</b>"),
            widgets.HBox(list(self.controls.values())),
            widgets.HBox([self.run_button, self.stop_button]),
            self.verdict,
            widgets.HBox([self.play, self.slider, self.when]),
            self.which, self.picture, self.legend, self.state_panel])
        self.box = self                     # the name it had when the box was a separate widget
        # Stable CSS classes: the browser tests (tests/test_browser.py) find the parts by them.
        for part, css in [(self, "mpviz-live"), (self.run_button, "mpviz-run"),
                          (self.verdict, "mpviz-verdict"), (self.state_panel, "mpviz-state"),
                          (self.slider, "mpviz-slider"), (self.play, "mpviz-play")]:
            part.add_class(css)

    def _init_stepped(self, target, params):
        """``stepped=True``: be the scheduler. The box holds the parts of a
        ``mpviz.widgets.Stepper`` (one button per choice, Undo, the wait-for graph...), which is
        ``self.stepping``; ``self.stepper`` is the run (``mpviz.stepper.Stepper``). `target`: a
        puzzle name (``mpviz.scenarios.puzzles``) or an importable function; `params`: its
        parameters."""
        super().__init__()
        self.stepping = Stepper(target, box=self, **params)
        self.stepper = self.stepping.stepper
        self.trace, self.result, self.controls = None, None, {}
        self.box = self                     # as a Live that runs: the box is the Live itself

    def click(self, choice):
        """Stepped: step `choice` (a label, its start, a who, or an index), as its button does."""
        self._needs_stepped("click")
        return self.stepping.click(choice)

    def close(self):
        """Close the widget; stepped, first end every process of the run (paused or blocked)."""
        if getattr(self, "stepping", None) is not None:
            self.stepping.stepper.close()
        super().close()

    def _needs_stepped(self, what):
        if self.stepping is None:
            raise RuntimeError(f"Live({self.name!r}).{what}(): only a stepped Live has choices to "
                               f"click. Fix: Live({self.name!r}, stepped=True).")

    def _not_stepped(self, what):
        if self.stepping is not None:
            raise RuntimeError(
                f"Live({self.name!r}, stepped=True).{what}(): a stepped run moves one choice at a "
                f"time, by click(choice); it has no Run, Stop or slider. Fix: click(...) (or its "
                f"buttons), or .stepper.run_freely() to let it run to the end.")

    # --- display: a VBox displays itself (the last line of a cell, or inside another box) ---

    def __repr__(self):
        if self.stepping is not None:
            # (the outcome as last judged: judging it now would wait for the run to settle)
            return f"<mpviz Live {self.name!r}, stepped: {self.stepper._outcome or 'running'}>"
        state = "running" if self.running else ("finished" if self.result else "ready")
        return f"<mpviz Live {self.name!r}: {state}>"

    @property
    def running(self):
        return getattr(self, "_poller", None) is not None and self._poller.is_alive()

    # --- controls ---

    @staticmethod
    def _make_controls(target, given):
        specs = {}                                      # name -> (default, choices, help)
        if isinstance(target, str):
            from mpviz import scenarios
            info = {i.name: i for i in scenarios.catalog()}
            key = target.replace("_", "-")
            if key not in info:
                raise ValueError(f"unknown scenario {target!r}; the scenarios are: "
                                 f"{', '.join(info)}")
            for pname, p in info[key].params.items():
                specs[pname] = (p.default, p.choices, p.help)
        else:
            for pname, p in inspect.signature(target).parameters.items():
                if p.default is not inspect.Parameter.empty:
                    specs[pname] = (p.default, None, "")
        for pname, value in given.items():
            if pname not in specs and isinstance(target, str):
                raise ValueError(f"scenario {target!r} has no parameter {pname!r}; its "
                                 f"parameters are: {', '.join(specs) or 'none'}")
            if isinstance(value, (list, tuple)):
                specs[pname] = (value[0], list(value), "")
            else:
                d, c, h = specs.get(pname, (value, None, ""))
                specs[pname] = (value, c, h)
        out = {}
        for pname, (default, choices, help_) in specs.items():
            style = {"description_width": "initial"}
            if choices:
                w = widgets.Dropdown(options=list(choices), value=default, description=pname,
                                     style=style)
            elif isinstance(default, bool):
                w = widgets.Checkbox(value=default, description=pname, indent=False)
            elif isinstance(default, int):
                w = widgets.IntText(value=default, description=pname, style=style,
                                    layout=widgets.Layout(width="160px"))
            elif isinstance(default, float):
                w = widgets.FloatText(value=default, description=pname, style=style,
                                      layout=widgets.Layout(width="160px"))
            else:
                w = widgets.Text(value="" if default is None else str(default),
                                 description=pname, style=style)
            w.tooltip = help_ or None
            out[pname] = w
        return out

    def params(self):
        """The current control values, as keyword arguments."""
        return {k: w.value for k, w in self.controls.items()}

    # --- running ---

    def run(self):
        """Start the work (what the Run button does); returns at once."""
        self._not_stepped("run")
        if self.running:
            return
        self._stop.clear()
        self._finished.clear()
        self.result, self.frames, self.refreshes = None, 0, 0
        self._snapshot = None
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.play.disabled = self.slider.disabled = True
        self.verdict.value = "<i>running…</i>"
        params = self.params()
        if isinstance(self.target, str):
            from mpviz import scenarios
            self._running = scenarios.start(self.target, **params)
            self.trace = self._running.trace()
        else:
            self._running = _CallableRun(self.target, params)
            self.trace = self._running.trace
        self._poller = threading.Thread(target=self._poll, name="mpviz-live", daemon=True)
        self._dirty = threading.Event()
        self._painter = threading.Thread(target=self._paint, name="mpviz-live-paint",
                                         daemon=True)
        self._painter.start()
        self._poller.start()

    def stop(self):
        """Kill the running work (what the Stop button does)."""
        self._not_stepped("stop")
        self._stop.set()
        if self._running is not None:
            self._running.stop()

    def wait(self, timeout=None, show=None):
        """Block until the run has finished and the scrubber is ready; True if it has.

        In a notebook (`show` None: when IPython runs this) it then also displays the final
        picture as a plain PNG under the cell: a notebook run headless (nbval, nbconvert, a
        saved .ipynb read on GitHub) has no widget views, and would otherwise show only the
        line ``<mpviz Live ...: finished>`` where a person sees the picture."""
        self._not_stepped("wait")
        finished = self._finished.wait(timeout)
        if show is None:
            show = _in_ipython()
        if finished and show:
            self.show_final()
        return finished

    def show_final(self):
        """Display the picture the widget shows now (after a run: the end) as a static PNG."""
        from IPython.display import display
        for output in self.picture.outputs:
            data = dict(output.get("data", {}))
            if "image/png" in data:
                data["text/plain"] = f"<mpviz {self.which.value} of {self.name!r}, at the end>"
                display(data, raw=True)

    def _poll(self):
        """Every 1/REFRESH_HZ s: read new events, update the state panel, ask for a picture."""
        start = time.monotonic()
        try:
            while not self._running.done():
                tick = time.monotonic()
                if self.trace.refresh() or self._snapshot is None:
                    # the painter draws a copy: refresh() re-sorts the live list in place
                    self._snapshot = self.trace.snapshot()
                if self._snapshot.events:
                    self.state_panel.value = _state_html(viz.state_at(self._snapshot))
                self.refreshes += 1
                self._dirty.set()
                self._stop.wait(max(0.0, 1 / REFRESH_HZ - (time.monotonic() - tick)))
            self._dirty.set()
            self._painter.join()
            result = self._running.result(timeout=60)
        except Exception as exc:               # a broken run must still leave a usable widget
            result = LiveResult(self.name, self.params(), self.trace, "error",
                                f"{type(exc).__name__}: {exc}", time.monotonic() - start)
        self.result = result
        self.trace = result.trace if getattr(result, "trace", None) is not None else self.trace
        self._finish()

    def _paint(self):
        """Redraw the live timeline whenever the poll thread has read something: as often as
        drawing allows (a picture takes ~0.1 s; on a busy machine frames are dropped)."""
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._running.done():
                return
            snapshot = self._snapshot
            if snapshot is not None and snapshot.events:
                self._show_picture(lambda: viz.timeline(snapshot, fast=True, max_labels=0),
                                   dpi=60)
                self.frames += 1

    def _finish(self):
        events = self.trace.events if self.trace is not None else []
        stamps = sorted({e.ts_ns for e in events})
        if len(stamps) > MAX_STEPS:
            stamps = [stamps[round(i * (len(stamps) - 1) / (MAX_STEPS - 1))]
                      for i in range(MAX_STEPS)]
        self.instants = stamps
        r = self.result
        color = {"ok": "#2ca02c", "warning": COLORS["waiting"], "leak": COLORS["leak"]}.get(
            r.outcome, COLORS["deadlock"])
        self.verdict.value = (f"<b style='color:{color}'>{html.escape(r.outcome.upper())}</b> "
                              f"({r.duration_s:.1f} s)<div style='white-space:pre-wrap;"
                              f"word-break:normal;overflow-wrap:break-word;line-height:1.4;"
                              f"max-width:60em'>{html.escape(str(r.explanation))}</div>")
        self.run_button.disabled, self.stop_button.disabled = False, True
        last = max(0, len(stamps) - 1)
        self.slider.max = self.play.max = last
        self.play.disabled = self.slider.disabled = not stamps
        if self.slider.value == last:
            self._redraw_scrub()
        else:
            self.slider.value = last                  # the end: where the verdict is
        self._finished.set()

    # --- scrubbing ---

    def _on_slider(self, change):
        if self.instants:
            self._redraw_scrub()

    def show(self, t_ns):
        """Move the slider to the instant nearest `t_ns`."""
        self._not_stepped("show")
        import bisect
        i = bisect.bisect_left(self.instants, t_ns)
        self.slider.value = min(max(i, 0), len(self.instants) - 1)

    def state(self):
        """``mpviz.viz.state_at`` for the slider's instant (once a run has finished); stepped:
        the run's ``state()`` now (who is paused before what, who holds which lock...)."""
        if self.stepping is not None:
            return self.stepper.state()
        if not self.instants:
            why = ("it is still running" if self.running else
                   "its run recorded no events" if self.result is not None else
                   "nothing has run yet")
            raise RuntimeError(f"Live({self.name!r}).state(): there is no instant to show, "
                               f"because {why}. Fix: press Run (or call .run()), then "
                               f".wait() until it has finished, then ask for .state().")
        return viz.state_at(self.trace, self.instants[self.slider.value])

    def _redraw_scrub(self):
        if not self.instants or self.trace is None:
            return
        t = self.instants[min(self.slider.value, len(self.instants) - 1)]
        state = viz.state_at(self.trace, t)
        self.when.value = f"{state.t_s * 1000:.1f} ms"
        self.state_panel.value = _state_html(state)
        draw = {"timeline": lambda: viz.timeline(self.trace, at=t),
                "memory map": lambda: viz.memory_map(self.trace, at=t),
                "wait-for": lambda: viz.wait_for(self.trace, at=t)}[self.which.value]
        self._show_picture(draw)

    def _show_picture(self, draw, dpi=72):
        _render_in_background(lambda: self._draw_into_output(draw, dpi))

    def _draw_into_output(self, draw, dpi):
        with self._draw_lock:
            fig = draw()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})
            png = base64.b64encode(buf.getvalue()).decode("ascii")
            self.picture.outputs = ({"output_type": "display_data", "metadata": {},
                                     "data": {"image/png": png,
                                              "text/plain": "<mpviz picture>"}},)


def _in_ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def _render_in_background(job):
    """Run `job` on the one drawing thread this process keeps, and wait for it.

    Why one thread: matplotlib caches fonts (open files) per thread, so drawing from a new
    thread at every run would leave a few more font files open each time."""
    global _RENDERER
    if _RENDERER is None:
        from concurrent.futures import ThreadPoolExecutor
        _RENDERER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpviz-draw")
    return _RENDERER.submit(job).result()


class _CallableRun:
    """Runs `fn(**params)` in a thread, recording into a temporary directory."""

    def __init__(self, fn, params):
        self.fn, self.params = fn, params
        self.directory = _tempdirs.make("mpviz-live-")
        self.trace = mt.Trace(self.directory)
        self.outcome, self.value, self.error = None, None, None
        self._before = {p.pid for p in multiprocessing.active_children()}
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._work, name="mpviz-live-work", daemon=True)
        self._thread.start()

    def _work(self):
        try:
            with mt.record(self.directory):
                self.value = self.fn(**self.params)
        except BaseException as exc:          # the verdict, not a crash of the widget
            self.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()

    def done(self):
        return not self._thread.is_alive()

    def stop(self):
        for p in multiprocessing.active_children():
            if p.pid not in self._before:
                p.kill()
        self.outcome = "stopped"

    def result(self, timeout=None):
        self._thread.join(timeout)
        trace = mt.load(self.directory)
        trace = trace.snapshot()   # keep the events, drop the directory
        _tempdirs.remove(self.directory)
        stuck = viz.deadlocks(trace)
        leaked = [s for s in viz.state_at(trace).segments if s.status == "leaked"]
        if self.outcome == "stopped":
            outcome, words = "stopped", "stopped by the Stop button"
        elif self.error:
            outcome, words = "error", self.error
        elif stuck:
            outcome, words = "deadlock", stuck[0].reason
        elif leaked:
            outcome = "leak"
            words = (f"{len(leaked)} segment(s) left in /dev/shm that no process maps "
                     f"({human_bytes(sum(s.nbytes or 0 for s in leaked))})")
        else:
            outcome = "ok"
            words = self.value if isinstance(self.value, str) else f"returned {self.value!r}"
        return LiveResult(getattr(self.fn, "__name__", "work"), dict(self.params), trace,
                          outcome, words, time.monotonic() - self._started)


_FD_SWATCH = ("<svg width='18' height='12' style='margin-right:4px;vertical-align:middle'>"
              "<line x1='0' y1='6' x2='18' y2='6' stroke='{color}' stroke-width='2' "
              "stroke-dasharray='3,2'/></svg>")


def _legend_html():
    items = []
    hatched = (f"background:repeating-linear-gradient(45deg,{BLOCKED_FILL} 0 3px,"
               f"{COLORS['blocked']} 3px 4px);border:1px solid {COLORS['blocked']}")
    for key in ("handle", "copy", "message", "fd", "blocked", "waiting", "holding", "leak",
                "deadlock"):
        stuck = (f"background:repeating-linear-gradient(135deg,white 0 3px,{COLORS[key]} 3px 4px);"
                 f"border:2px solid {COLORS[key]}")      # as the timeline: a frame, hatched
        style = {"waiting": f"border:2px dashed {COLORS[key]}", "deadlock": stuck,
                 "blocked": hatched}.get(key, f"background:{COLORS[key]}")
        swatch = (f"<span style='display:inline-block;width:12px;height:12px;{style};"
                  f"margin-right:4px;vertical-align:middle'></span>")
        if key == "fd":          # a line with the timeline's dashes (3 on, 2 off), long enough
            swatch = _FD_SWATCH.format(color=COLORS[key])   # to show more than three of them
        # swatch and words in one unbreakable box, so a line never separates them
        items.append(f"<span style='display:inline-block;white-space:nowrap;margin:0 12px 2px 0'>"
                     f"{swatch}{html.escape(WORDS[key])}</span>")
    return "<div style='font-size:85%;line-height:1.6'>" + "".join(items) + "</div>"


def _state_html(state):
    """The state panel: the four tables in plain words (escaped)."""
    return ("<pre style='font-size:85%;white-space:pre-wrap;margin:0'>" +
            html.escape(state.text()) + "</pre>")


__all__ = ["Live", "LiveResult"]

from mpviz.stepper_widget import Stepper  # noqa: E402  (be the scheduler: one button per choice)
__all__ += ["Stepper"]
