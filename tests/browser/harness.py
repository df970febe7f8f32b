"""One browser test's world: a temp copy of the notebooks, a JupyterLab server, headless Chromium,
screenshots, and a stop that leaves nothing running.

    run = BrowserRun(artifacts_dir, tmp_dir)
    nb = run.open_notebook("notebooks/00_overview.ipynb")    # a NotebookPage, kernel ready
    nb = run.open_notebook(path, flavour="notebook")         # ... or in Notebook 7 instead of Lab
    run.screenshot("after-run-all")                          # artifacts_dir/01-after-run-all.png
    problems = run.close()                                   # [] when everything stopped cleanly

Lifetime (each arrow is a process start; every one of them carries MPVIZ_BROWSER_TAG)::

    pytest ──► jupyter lab (SIGTERM on close) ──► ipykernel ──► whatever the notebook starts
       └─────► playwright driver (node) ──► chromium + its helpers   (browser.close, playwright.stop)

A test module with several browser tests shares one server and one browser among them
(:class:`SharedLab`, a module fixture): each test then gets a :class:`LabTest` -- its own copy of
the notebook, its own browser context, its own kernel, and at its end a check that its kernel and
whatever that kernel started are gone (the server and the browser keep running for the next
test; :meth:`SharedLab.close` stops them and checks the same of them at the module's end)::

    lab = SharedLab(artifacts_dir, tmp_dir).start()        # server + browser, once
    test = lab.test(artifacts_dir_of_the_test)              # per test; same use as a BrowserRun
    nb = test.open_notebook("notebooks/00_overview.ipynb")
    problems = test.close()                                 # its kernel is shut down and gone
    problems = lab.close()                                  # server and browser stopped and gone

The notebook is never opened where it is committed: its directory is copied into a temp dir and
the copy's outputs are cleared (so a run can only show what this run produced, and a test never
modifies a committed notebook). After closing, :meth:`close` waits a bounded time for every tagged
process to be gone, kills what is left and reports it: nothing the suite started survives it.

Chromium is Debian's (``/usr/bin/chromium``, or ``MPVIZ_CHROMIUM``): Playwright's own browser
download cannot work on these machines and is never used.
"""
import importlib.util
import json
import os
import shutil
import signal
import time
import urllib.request
import uuid

import pytest

from .lab import NotebookPage
from .server import TAG_VAR, LabServer, tagged_processes

SKIP_VAR = "MPVIZ_SKIP_BROWSER"
CHROMIUM_VAR = "MPVIZ_CHROMIUM"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 1400}   # tall enough for a whole Live widget
CLEANUP_TIMEOUT = 15    # seconds for the tagged processes to go after the server and browser stop


def skip_if_asked():
    """Skip (visibly) when MPVIZ_SKIP_BROWSER is set to anything but "" or "0"."""
    value = os.environ.get(SKIP_VAR, "")
    if value not in ("", "0"):
        pytest.skip(f"browser tests skipped because {SKIP_VAR}={value!r}")


def chromium_path():
    """Debian's Chromium, or a clear failure saying how to get it (or how to skip on purpose)."""
    exe = os.environ.get(CHROMIUM_VAR) or shutil.which("chromium") or "/usr/bin/chromium"
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        pytest.fail(
            f"Chromium not found (looked for {exe}): the browser tests drive Debian's chromium "
            f"package through Playwright. Install it with `sudo apt-get install chromium` (.ci/run "
            f"does this), or point {CHROMIUM_VAR} at a Chromium binary, or set {SKIP_VAR}=1 to skip "
            f"the browser tests on purpose.", pytrace=False)
    if importlib.util.find_spec("playwright") is None:
        pytest.fail(f"the Python package playwright is missing: install the browser extra, "
                    f"`pip install -e '.[browser]'` (./run test does), or set {SKIP_VAR}=1 to skip "
                    f"the browser tests on purpose. Never `playwright install`: Debian's chromium "
                    f"is used.", pytrace=False)
    return exe


def copy_for_test(notebook, root, copy_dir=True):
    """Copy `notebook`'s directory (or only the notebook) into `root`, clear the copy's outputs,
    and give it the python3 kernelspec if it names none (else Lab asks which kernel to use).
    Returns the copy's name."""
    import nbformat
    src_dir = os.path.dirname(os.path.abspath(notebook))
    name = os.path.basename(notebook)
    path = os.path.join(root, name)
    if copy_dir:  # the notebook may read files beside it
        shutil.copytree(src_dir, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    else:
        os.makedirs(root)
        shutil.copyfile(notebook, path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)  # saved widget state would show widgets before any cell ran
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                          "language": "python"})
    nbformat.write(nb, path)
    return name


class Moments:
    """Screenshots and timings of one test's moments, in its artifacts dir (BrowserRun, LabTest),
    and the page they are taken of (with its console messages)."""

    def __init__(self, artifacts_dir):
        self.artifacts_dir = str(artifacts_dir)
        self.context = None
        self.page = None
        self.console = []
        self.timings = []
        self._started = None
        self._shots = 0
        shutil.rmtree(self.artifacts_dir, ignore_errors=True)
        os.makedirs(self.artifacts_dir)

    def _new_page(self, browser):
        """A fresh browser context and page, its console messages kept for console.log."""
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def screenshot(self, what, locator=None):
        """Save the page (or one element of it) as NN-what.png in the artifacts dir; the path."""
        self._shots += 1
        path = os.path.join(self.artifacts_dir, f"{self._shots:02d}-{what}.png")
        self.mark(what)
        (locator or self.page).screenshot(path=path, **({} if locator else {"full_page": False}))
        return path

    def mark(self, what):
        """Note the time of a moment (seconds since open_notebook) in timings.txt."""
        if self._started is not None:
            self.timings.append(f"{time.monotonic() - self._started:7.2f} s  {what}")


class BrowserRun(Moments):
    """See the module docstring. Nothing starts until :meth:`open_notebook`."""

    def __init__(self, artifacts_dir, tmp_dir):
        super().__init__(artifacts_dir)
        self.tmp_dir = str(tmp_dir)
        self.tag = uuid.uuid4().hex
        self.server = None
        self.playwright = None
        self.browser = None

    def open_notebook(self, notebook, copy_dir=True, flavour="lab"):
        """Serve a copy of `notebook` (with its directory unless `copy_dir` is False), open it in
        Chromium -- in JupyterLab, or with `flavour` "notebook" in Notebook 7 (served by the same
        server when the notebook package is installed) -- and wait for its kernel: a NotebookPage."""
        exe = chromium_path()
        self._started = time.monotonic()
        name = copy_for_test(notebook, os.path.join(self.tmp_dir, "root"), copy_dir)
        self.server = LabServer(os.path.join(self.tmp_dir, "root"),
                                os.path.join(self.artifacts_dir, "jupyter.log"),
                                self.tag, os.path.join(self.tmp_dir, "jupyter")).start()
        from playwright.sync_api import sync_playwright
        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=exe, headless=True, args=CHROMIUM_ARGS, timeout=60_000,
            env={**os.environ, TAG_VAR: self.tag})
        self._new_page(self.browser)
        self.mark("server and browser started")
        nb = NotebookPage(self.page, self.server, name, flavour).open()
        self.mark("notebook open, kernel ready")
        return nb

    def close(self):
        """Stop everything, in order; return what did not go cleanly (empty when all did)."""
        problems = []

        def attempt(what, fn):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- keep stopping the rest, report at the end
                problems.append(f"{what}: {type(e).__name__}: {e}")

        if self.page is not None:
            attempt("final screenshot", lambda: self.screenshot("final"))
        with open(os.path.join(self.artifacts_dir, "console.log"), "w") as f:
            f.write("\n".join(self.console))
        if self.context is not None:
            attempt("closing the browser context", self.context.close)
        if self.browser is not None:
            attempt("closing the browser", self.browser.close)
        if self.playwright is not None:
            attempt("stopping playwright", self.playwright.stop)
        if self.server is not None:
            problem = self.server.stop()
            if problem:
                problems.append(problem)
        problems += self._leftovers()
        self.mark("everything stopped")
        with open(os.path.join(self.artifacts_dir, "timings.txt"), "w") as f:
            f.write("\n".join(self.timings) + "\n")
        return problems

    def _leftovers(self):
        """Wait (bounded) for every process this run started to be gone; kill and name the rest."""
        return leftovers(lambda: tagged_processes(self.tag))


def leftovers(find, what="the stop"):
    """Wait (bounded) until `find()` ({pid: command line}) is empty; kill and name what is left."""
    deadline = time.monotonic() + CLEANUP_TIMEOUT
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)  # bounded poll: processes exit asynchronously after their parent
        left = find()
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return [f"still running {CLEANUP_TIMEOUT} s after {what} (now killed): pid {pid}: {cmd}"
            for pid, cmd in left.items()]


class SharedLab:
    """One JupyterLab server and one headless Chromium, shared by the tests of a module; see the
    module docstring. Chromium carries a tag of its own (``<tag>-browser``), so that what is left
    of one test -- its kernel and what the kernel started, which carry the server's tag -- can be
    told from the browser, which stays."""

    def __init__(self, artifacts_dir, tmp_dir):
        self.artifacts_dir = str(artifacts_dir)
        self.tmp_dir = str(tmp_dir)
        self.root = os.path.join(self.tmp_dir, "root")
        self.tag = uuid.uuid4().hex
        self.browser_tag = self.tag + "-browser"
        self.server = None
        self.playwright = None
        self.browser = None
        self._tests = 0
        shutil.rmtree(self.artifacts_dir, ignore_errors=True)
        os.makedirs(self.artifacts_dir)
        os.makedirs(self.root)

    def start(self):
        exe = chromium_path()
        self.server = LabServer(self.root, os.path.join(self.artifacts_dir, "jupyter.log"),
                                self.tag, os.path.join(self.tmp_dir, "jupyter")).start()
        from playwright.sync_api import sync_playwright
        self.playwright = sync_playwright().start()
        self.browser = self.playwright.chromium.launch(
            executable_path=exe, headless=True, args=CHROMIUM_ARGS, timeout=60_000,
            env={**os.environ, TAG_VAR: self.browser_tag})
        return self

    def test(self, artifacts_dir):
        """A LabTest: one test's notebook copy, browser context and kernel."""
        self._tests += 1
        return LabTest(self, artifacts_dir, f"t{self._tests}")

    def test_processes(self):
        """{pid: command line} of what a test left: the server's tagged processes but the server."""
        left = tagged_processes(self.tag)
        left.pop(self.server.proc.pid, None)
        return left

    def shut_down_kernels(self):
        """Ask the server to shut down every session and kernel it runs (a test's, at its end):
        as Lab's "Shut Down All Kernels" does. Returns a problem in words, or None."""
        try:
            for kind in ("sessions", "kernels"):
                for item in self._api("GET", f"api/{kind}"):
                    self._api("DELETE", f"api/{kind}/{item['id']}")
        except Exception as e:  # noqa: BLE001 -- reported, and the leftovers are killed anyway
            return f"shutting the test's kernels down: {type(e).__name__}: {e}"
        return None

    def _api(self, method, path):
        request = urllib.request.Request(self.server.url(path), method=method)
        with urllib.request.urlopen(request, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def close(self):
        """Stop browser, Playwright and server; return what did not go cleanly ([] when all did)."""
        problems = []
        for what, fn in [("closing the browser", self.browser and self.browser.close),
                         ("stopping playwright", self.playwright and self.playwright.stop)]:
            if fn:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 -- keep stopping the rest, report at the end
                    problems.append(f"{what}: {type(e).__name__}: {e}")
        if self.server is not None:
            problem = self.server.stop()
            if problem:
                problems.append(problem)
        problems += leftovers(lambda: {**tagged_processes(self.tag),
                                       **tagged_processes(self.browser_tag)})
        return problems


class LabTest(Moments):
    """One test on a SharedLab: used as a BrowserRun is (open_notebook, screenshot, page, close).
    Its notebook's copy is served from a directory of its own, and opened in a Lab workspace of
    its own (a fresh layout: no tab of an earlier test reopens)."""

    def __init__(self, lab, artifacts_dir, key):
        super().__init__(artifacts_dir)
        self.lab = lab
        self.key = key

    def open_notebook(self, notebook, copy_dir=True, flavour="lab"):
        """As BrowserRun.open_notebook, on the shared server and browser."""
        self._started = time.monotonic()
        name = copy_for_test(notebook, os.path.join(self.lab.root, self.key), copy_dir)
        self._new_page(self.lab.browser)
        self.mark("browser context open")
        nb = NotebookPage(self.page, self.lab.server, f"{self.key}/{name}", flavour,
                          workspace=f"test-{self.key}").open()
        self.mark("notebook open, kernel ready")
        return nb

    def close(self):
        """Close this test's browser context, shut its kernel down, and check that nothing it
        started is still running; return what did not go cleanly ([] when all did)."""
        problems = []
        if self.page is not None:
            try:
                self.screenshot("final")
            except Exception as e:  # noqa: BLE001 -- keep stopping the rest, report at the end
                problems.append(f"final screenshot: {type(e).__name__}: {e}")
        with open(os.path.join(self.artifacts_dir, "console.log"), "w") as f:
            f.write("\n".join(self.console))
        if self.context is not None:
            try:
                self.context.close()
            except Exception as e:  # noqa: BLE001
                problems.append(f"closing the browser context: {type(e).__name__}: {e}")
        problem = self.lab.shut_down_kernels()
        if problem:
            problems.append(problem)
        problems += leftovers(self.lab.test_processes, "the test's kernels were shut down")
        self.mark("everything of the test stopped")
        with open(os.path.join(self.artifacts_dir, "timings.txt"), "w") as f:
            f.write("\n".join(self.timings) + "\n")
        return problems
