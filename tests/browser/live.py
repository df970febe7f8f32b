"""The Live widget as the page shows it, found by the CSS classes it promises (ipywidgets 8
``add_class``); the contract is written out in tests/test_browser.py's docstring.

    .mpviz-live                       the whole widget (a VBox)
      .mpviz-run                      Run button
      .mpviz-verdict                  the verdict (empty until a run ends)
      .widget-output img              the picture (a matplotlib figure shown in an Output widget)
      .mpviz-play                     Play (buttons: play, pause, stop, repeat)
      .mpviz-slider                   the time slider (a noUiSlider: .noUi-target, .noUi-handle)
      .mpviz-state                    the state panel: what is true at the slider's time

Everything here waits with a bound and says what it waited for when the bound is reached.
"""

CLASSES = {
    "root": "mpviz-live",
    "run": "mpviz-run",
    "verdict": "mpviz-verdict",
    "state": "mpviz-state",
    "slider": "mpviz-slider",
    "play": "mpviz-play",
}
PICTURE = ".widget-output img"

VERDICT_TIMEOUT = 120_000   # ms: a scenario runs in real processes, under a watchdog
CHANGE_TIMEOUT = 20_000     # ms: a slider move or a Play tick goes to the kernel and back


# Installed on the root before Run is clicked: notes that a run started (Run disabled or the verdict
# changed), even if it ends between two polls.
WATCH_RUN_JS = """(root, [run, verdict]) => {
  const before = (root.querySelector(verdict) || {}).innerText;
  root.__mpvizRunStarted = false;
  const check = () => {
    const b = root.querySelector(run), v = root.querySelector(verdict);
    if ((b && b.disabled) || (v && v.innerText !== before)) root.__mpvizRunStarted = true;
  };
  if (root.__mpvizObserver) root.__mpvizObserver.disconnect();
  root.__mpvizObserver = new MutationObserver(check);
  root.__mpvizObserver.observe(root, {subtree: true, childList: true, attributes: true,
                                      characterData: true});
}"""
DONE_JS = """{
  const b = root.querySelector('.%s'), v = root.querySelector('.%s');
  return root.__mpvizRunStarted && b !== null && !b.disabled && v !== null &&
         v.innerText.trim() !== '';
}""" % (CLASSES["run"], CLASSES["verdict"])


def _text_changed_js(selector):
    return """([root, before]) => {
      const node = root.querySelector('%s');
      if (!node) return false;
      const text = node.innerText.trim();
      return text !== '' && text !== before;
    }""" % selector


class LiveWidget:
    """One Live widget (or anything with the same classes) in a Playwright page."""

    def __init__(self, page, root):
        self.page = page
        self.root = root                      # a Locator for the .mpviz-live element

    @classmethod
    def find(cls, page, also=None, timeout=30_000):
        """The first widget with the root class (and the class `also`, when given)."""
        root = page.locator(f".{CLASSES['root']}" + (f".{also}" if also else "")).first
        root.wait_for(state="visible", timeout=timeout)
        root.scroll_into_view_if_needed()
        return cls(page, root)

    def part(self, name):
        return self.root.locator(f".{CLASSES[name]}").first

    def text(self, name):
        return self.part(name).inner_text().strip()

    # --- run ---------------------------------------------------------------------------------

    def click_run(self):
        """Click Run, first setting a watch on the page: has the run started (the Run button got
        disabled, or the verdict changed)? :meth:`wait_verdict` needs to know, because a verdict
        from an earlier run (a cell may have run the widget already) looks just like a new one."""
        button = self.part("run")
        button.wait_for(state="visible")
        self.root.evaluate(WATCH_RUN_JS, [f".{CLASSES['run']}", f".{CLASSES['verdict']}"])
        button.click()

    def wait_verdict(self, timeout=VERDICT_TIMEOUT):
        """Wait until the run started by :meth:`click_run` has ended -- the Run button is enabled
        again and the verdict is not empty -- and return the verdict's text."""
        self.root.evaluate(f"root => root.__mpvizDone = () => {DONE_JS}")
        handle = self.root.element_handle()
        self.page.wait_for_function("root => root.__mpvizDone()", arg=handle, timeout=timeout,
                                    polling=200)
        return self.text("verdict")

    def picture(self):
        return self.root.locator(PICTURE).first

    # --- time: slider and Play ---------------------------------------------------------------

    def slider_value(self):
        """The slider's readout as the page shows it (the value, or a SelectionSlider's label)."""
        slider = self.part("slider")
        readout = slider.locator(".widget-readout")
        if readout.count():
            return readout.first.inner_text().strip()
        return slider.locator(".noUi-handle").first.get_attribute("aria-valuenow")

    def move_slider(self, fraction):
        """Drag the slider's handle to `fraction` (0..1) of its track, with the mouse."""
        slider = self.part("slider")
        # a widget may enable its slider a moment after showing the verdict (separate updates)
        track = slider.locator(".noUi-target:not([disabled])").first
        track.wait_for(timeout=CHANGE_TIMEOUT)
        handle = slider.locator(".noUi-handle").first
        track.scroll_into_view_if_needed()
        t, h = track.bounding_box(), handle.bounding_box()
        self.page.mouse.move(h["x"] + h["width"] / 2, h["y"] + h["height"] / 2)
        self.page.mouse.down()
        self.page.mouse.move(t["x"] + fraction * t["width"], t["y"] + t["height"] / 2, steps=12)
        self.page.mouse.up()

    def wait_state_change(self, before, timeout=CHANGE_TIMEOUT):
        """Wait until the state panel's text differs from `before`; return it."""
        handle = self.root.element_handle()
        self.page.wait_for_function(_text_changed_js(f".{CLASSES['state']}"),
                                    arg=[handle, before], timeout=timeout, polling=100)
        return self.text("state")

    def wait_slider_change(self, before, timeout=CHANGE_TIMEOUT):
        handle = self.part("slider").element_handle()
        self.page.wait_for_function(
            """([slider, before]) => {
                 const r = slider.querySelector('.widget-readout');
                 const h = slider.querySelector('.noUi-handle');
                 const now = r ? r.innerText.trim() : (h && h.getAttribute('aria-valuenow'));
                 return now !== null && now !== before;
               }""", arg=[handle, before], timeout=timeout, polling=100)
        return self.slider_value()

    def toggle_play(self):
        """Click Play's first button: ipywidgets 8 shows one play/pause toggle, then stop, repeat."""
        self.part("play").locator("button").first.click()
