"""``Stepper`` (as ``mpviz.widgets.Stepper``): be the scheduler with buttons.

    from mpviz.widgets import Stepper
    Stepper("lock-order")                 # a puzzle (its goal on top); or Stepper(my_function)
    Live("lock-order", stepped=True)      # the same, as a Live widget (itself an ipywidgets VBox)

    ┌ Goal: make main and child each hold one lock and wait for the other ─────────────┐
    │ [main/main: acquire lock A (free)]  [child/main: acquire lock B (free)]  ← choices  │
    │ [Undo] [Restart] [Close]                                                            │
    │ who is paused before what, who is blocked in what, who holds which lock            │
    │ the wait-for graph, redrawn after each step                                         │
    │ outcome: deadlock -- and why                                                        │
    └─────────────────────────────────────────────────────────────────────────────────────┘

One button per choice: a click is ``stepper.step(label)`` (mpviz.stepper.control), then every
panel is redrawn from ``stepper.state()``. Undo is "restart and replay the same choices but the
last" (a run of real processes cannot be rewound). ``click(label)`` does what a click does, so a
notebook cell (and nbval) can drive the widget as a learner would. Close it (``close()``, or the
Close button) to end the run's processes.

CSS classes (ipywidgets 8 ``add_class``), for styling and for the browser test: ``mpviz-stepper``
(the root), ``mpviz-goal``, ``mpviz-choice`` (each choice's button), ``mpviz-undo``,
``mpviz-restart``, ``mpviz-close``, ``mpviz-state`` (the status table), ``mpviz-outcome``.
"""
import base64
import html
import io

import ipywidgets as widgets


class Stepper:
    """An ipywidgets app around a ``mpviz.stepper.Stepper``; display it (last line of a cell).

    `target`: a puzzle name (``params`` are its parameters), a function (``params`` are its
    keyword arguments), or a Stepper you made. `box`: the VBox to build the parts into (a new
    one if None; ``Live(..., stepped=True)`` passes itself).
    """

    def __init__(self, target, picture=True, box=None, **params):
        from mpviz.stepper.control import Stepper as Core, step
        if isinstance(target, Core):
            self.stepper = target
        elif isinstance(target, str):
            import mpviz.scenarios as sc
            self.stepper = sc.step(target, **params)
        elif callable(target):
            self.stepper = step(target, **params)
        else:
            raise TypeError(f"Stepper(target): a puzzle name, a function or an "
                            f"mpviz.stepper.Stepper, not {type(target).__name__}")
        self.show_picture = picture
        goal = getattr(self.stepper, "goal", None)
        self.goal = widgets.HTML(f"<b>Goal:</b> {html.escape(goal)}" if goal else
                                 "<b>You are the scheduler:</b> choose who goes next.")
        self.buttons = widgets.VBox()
        self.undo_button = widgets.Button(description="Undo", icon="undo")
        self.restart_button = widgets.Button(description="Restart", icon="refresh")
        self.close_button = widgets.Button(description="Close", icon="stop")
        self.undo_button.on_click(lambda _: self._act(self.stepper.undo))
        self.restart_button.on_click(lambda _: self._act(self.stepper.restart))
        self.close_button.on_click(lambda _: self.close())
        self.status = widgets.HTML()
        self.picture = widgets.Output()
        self.outcome = widgets.HTML()
        self.box = box if box is not None else widgets.VBox()
        self.box.children = (self.goal, self.buttons,
                             widgets.HBox([self.undo_button, self.restart_button,
                                           self.close_button]),
                             self.status, self.picture, self.outcome)
        for w, css in [(self.box, "stepper"), (self.goal, "goal"), (self.undo_button, "undo"),
                       (self.restart_button, "restart"), (self.close_button, "close"),
                       (self.status, "state"), (self.outcome, "outcome")]:
            w.add_class(f"mpviz-{css}")
        self.redraw()

    def _ipython_display_(self):
        from IPython.display import display
        display(self.box)

    # --- what a click does ------------------------------------------------------------------

    def click(self, choice):
        """Step `choice` (a label, who or index), as clicking its button does; then redraw."""
        self.stepper.step(choice)
        self.redraw()
        return self

    def _act(self, action):
        try:
            action()
        except Exception as exc:         # shown in the widget: a click has no cell to fail in
            self.outcome.value = f"<span style='color:#b00'>{html.escape(str(exc))}</span>"
            return
        self.redraw()

    def close(self):
        """End the run's processes; the widget stays as it was, buttons off."""
        self.stepper.close()
        for b in self.buttons.children + (self.undo_button, self.restart_button):
            b.disabled = True
        self.outcome.value += "<br><i>closed: every process of the run has ended.</i>"

    # --- drawing ---------------------------------------------------------------------------------

    def redraw(self):
        choices = self.stepper.choices()
        buttons = []
        for c in choices:
            b = widgets.Button(description=c.label, tooltip=c.label,
                               layout=widgets.Layout(width="auto"))
            b.on_click(lambda _, label=c.label: self._act(lambda: self.stepper.step(label)))
            b.add_class("mpviz-choice")
            buttons.append(b)
        self.buttons.children = tuple(buttons)
        self.undo_button.disabled = not self.stepper.history
        state = self.stepper.state()
        rows = "".join(f"<tr><td><code>{html.escape(who)}</code></td><td>{html.escape(status)}"
                       f"</td></tr>" for who, status in state.threads)
        locks = "".join(f"<li>lock {html.escape(n)}: "
                        f"{'held by ' + html.escape(h) if h else 'free'}</li>"
                        for n, h in state.locks.items())
        self.status.value = (f"<table>{rows}</table>" + (f"<ul>{locks}</ul>" if locks else "")
                             + f"<small>{len(state.steps)} step(s) taken</small>")
        outcome = self.stepper.outcome
        if outcome is None:
            self.outcome.value = "<b>running</b>: choose who goes next."
        else:
            colour = "#070" if outcome == "ok" else "#b00"
            self.outcome.value = (f"<b style='color:{colour}'>outcome: {outcome}</b><br>"
                                  f"{html.escape(self.stepper.explanation or '')}")
        if self.show_picture:
            self._draw_wait_for()

    def _draw_wait_for(self):
        import matplotlib.pyplot as plt
        if not self.stepper.trace.events:
            return
        fig = self.stepper.wait_for()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=72)
        plt.close(fig)
        png = base64.b64encode(buf.getvalue()).decode("ascii")
        self.picture.outputs = ({"output_type": "display_data", "metadata": {},
                                 "data": {"image/png": png, "text/plain": "<wait-for graph>"}},)
