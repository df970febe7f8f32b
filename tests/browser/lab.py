"""Driving one notebook in JupyterLab (or Notebook 7) the way a person does: open it, Run All, look.

    nb = NotebookPage(page, server, "00_overview.ipynb").open()   # waits for the kernel
    nb = NotebookPage(page, server, "00_overview.ipynb", flavour="notebook").open()   # Notebook 7
    nb = NotebookPage(page, server, "t1/00_overview.ipynb", workspace="t1").open()   # a fresh Lab layout
    nb.run_all()                      # Run menu → "Run All Cells"; waits until every cell ran
    nb.errors()                       # what went wrong, in words ([] when nothing)

What the person does goes through the page (menus, clicks); what the test *reads* comes from two
places, each the most reliable one for its question:

- the notebook's model, via ``window.jupyterapp`` (the server runs with
  ``LabApp.expose_app_in_browser``): which cells ran (execution counts), which are still running,
  which outputs are errors (``output_type == "error"`` with ``ename``/``evalue``);
- the page itself, for what only the page knows: a widget that failed to render ("Error displaying
  widget", "Javascript Error") is not in the model, only on the screen.

The one trap (see /work/shared/reference/browser_testing.md): right after loading, the execution
indicator says "idle" while the kernel is not yet connected ("No Kernel"); "Run All" clicked then
does nothing at all, silently. So :meth:`open` waits for both the idle indicator and the kernel's
name in the toolbar.

Notebook 7 is built from the same JupyterLab components, so everything below works on it unchanged
(checked with Notebook 7.6): ``window.jupyterapp`` (with ``JupyterNotebookApp.expose_app_in_browser``,
see server.py) whose ``shell.currentWidget`` is the NotebookPanel, the same execution indicator and
kernel name in the notebook's toolbar, the same Run menu with "Run All Cells", and the log console
command. Only the URL differs (:data:`FLAVOURS`).
"""
import json

# flavour -> the URL path that opens a notebook in it
FLAVOURS = {"lab": "lab/tree/", "notebook": "notebooks/"}

KERNEL_READY_TIMEOUT = 90_000   # ms: first start of a kernel in a fresh environment can be slow
RUN_ALL_TIMEOUT = 180_000       # ms: every cell of a workshop notebook

# The notebook's state, read from its model: [{index, type, source, count, running, outputs}].
STATUS_JS = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.content || !panel.sessionContext) return null;
  const session = panel.sessionContext.session;
  const kernel = session ? session.kernel : null;
  const cells = panel.content.widgets.map((cell, index) => {
    const m = cell.model;
    const c = {index, type: m.type, source: m.sharedModel.getSource()};
    if (m.type === 'code') {
      const prompt = cell.promptNode ? cell.promptNode.textContent : '';
      c.count = m.executionCount;
      c.running = m.executionState === 'running' || prompt.includes('*');
      c.outputs = m.outputs.toJSON().map(o => ({
        type: o.output_type, ename: o.ename || null, evalue: o.evalue || null}));
    }
    return c;
  });
  return {kernel: kernel ? kernel.status : null, cells};
}"""

# True when Run All has finished: the kernel is idle, nothing is running, and every non-empty code
# cell has an execution count -- or a cell failed (the kernel then aborts the cells queued after it).
RUN_ALL_DONE_JS = """() => {
  const s = (%s)();
  if (!s || s.kernel !== 'idle') return false;
  const code = s.cells.filter(c => c.type === 'code' && c.source.trim() !== '');
  if (code.some(c => c.running)) return false;
  return code.every(c => c.count !== null) ||
         code.some(c => c.outputs.some(o => o.type === 'error'));
}""" % STATUS_JS

# Text of rendered outputs that say a widget (or its JavaScript) failed: these never reach the model.
RENDER_ERRORS_JS = """() => {
  const bad = [];
  for (const node of document.querySelectorAll('.jp-OutputArea-output')) {
    const text = node.textContent || '';
    if (text.includes('Error displaying widget') || text.includes('Javascript Error') ||
        text.includes('Failed to load model class')) bad.push(text.trim().slice(0, 300));
  }
  return bad;
}"""

KERNEL_READY_JS = """() => {
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  const name = document.querySelector('.jp-Toolbar-kernelName');
  return indicator !== null && indicator.getAttribute('data-status') === 'idle' &&
         name !== null && name.textContent.includes('ipykernel');
}"""


def first_line(source, width=70):
    line = next((l for l in source.splitlines() if l.strip()), "")
    return line if len(line) <= width else line[:width - 1] + "…"


class NotebookPage:
    """One notebook open in `page` (a Playwright Page): in JupyterLab (`flavour` "lab") or in
    Notebook 7 ("notebook")."""

    def __init__(self, page, server, name, flavour="lab", workspace=None):
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {sorted(FLAVOURS)}, not {flavour!r}")
        self.page = page
        self.server = server
        self.name = name
        self.flavour = flavour
        self.workspace = workspace   # Lab only: a named workspace starts with a layout of its own

    def open(self):
        path = FLAVOURS[self.flavour]
        if self.workspace and self.flavour == "lab":
            path = f"lab/workspaces/{self.workspace}/tree/"
        self.page.goto(self.server.url(path + self.name), wait_until="domcontentloaded")
        self.page.wait_for_selector(".jp-Notebook", timeout=KERNEL_READY_TIMEOUT)
        self.page.wait_for_function(KERNEL_READY_JS, timeout=KERNEL_READY_TIMEOUT, polling=100)
        self.page.wait_for_function("() => window.jupyterapp !== undefined", timeout=10_000)
        return self

    def status(self):
        return self.page.evaluate(STATUS_JS)

    def run_all(self):
        """Run → Run All Cells, as a person would; returns when the last cell has finished."""
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()
        self.page.wait_for_function(RUN_ALL_DONE_JS, timeout=RUN_ALL_TIMEOUT, polling=200)

    def errors(self):
        """Every way a cell shows a failure, one line each; [] when every cell ran cleanly."""
        status = self.status()
        if status is None:
            return [f"{self.name}: no notebook is open in the page"]
        problems = []
        for c in status["cells"]:
            if c["type"] != "code":
                continue
            where = f"cell {c['index']} ({first_line(c['source'])!r})"
            for o in c["outputs"]:
                if o["type"] == "error":
                    problems.append(f"{where} shows an error: {o['ename']}: {o['evalue']}")
            if c["source"].strip() and c["count"] is None:
                problems.append(f"{where} did not run")
        problems += [f"an output failed to render: {t}" for t in self.page.evaluate(RENDER_ERRORS_JS)]
        return problems

    def log_console(self):
        """Lab's log console, opened: ``[(level, text)]`` of its entries. A widget callback's output
        goes there, not to a cell (ipywidgets 8 logs it: "error" for an exception or stderr,
        "warning" otherwise), so this is where an exception inside Live's Run shows up.
        Notebook 7 has the same log console, but its one-document main area keeps it hidden behind
        the notebook: it is filled all the same (checked), so there it is read without being seen."""
        self.page.evaluate("() => window.jupyterapp.commands.execute('logconsole:open')")
        self.page.locator(".jp-LogConsolePanel").first.wait_for(
            state="visible" if self.flavour == "lab" else "attached", timeout=10_000)
        return self.page.evaluate("""() => Array.from(
            document.querySelectorAll('.jp-LogConsolePanel .jp-OutputArea-child'), child => {
              const prompt = child.querySelector('[data-log-level]');
              const out = child.querySelector('.jp-OutputArea-output');
              return [prompt ? prompt.dataset.logLevel : null, out ? out.innerText.trim() : ''];
            })""")

    def logged_exceptions(self):
        """The log console's entries that are exceptions (a traceback), as text; [] when none."""
        return [text for level, text in self.log_console()
                if level == "error" and ("Traceback" in text or "Error" in text)]

    def dump_status(self, path):
        with open(path, "w") as f:
            json.dump(self.status(), f, indent=1)
