"""A JupyterLab server for one browser test: private directories, random port and token, clean stop.

    server = LabServer(root_dir, log_path, tag).start()   # returns once /api/status answers
    server.url("lab/tree/NB.ipynb")                        # http://127.0.0.1:PORT/lab/tree/NB.ipynb?token=…
    server.url("notebooks/NB.ipynb")                       # the same notebook in Notebook 7 (when the
                                                           # notebook package is installed, the same
                                                           # server serves it beside Lab)
    server.stop()                                          # SIGTERM, wait; kernels go with it

How it is isolated from the machine it runs on::

    tmp/
      config/    JUPYTER_CONFIG_DIR: Lab's user settings live here (lab/user-settings), so a
                 developer's own settings never leak in; the test writes three of them:
                   no "Jupyter news" pop-up, no update check, and windowingMode "none" (every cell
                   stays in the page, so the test can see every output, not only the visible ones)
      runtime/   JUPYTER_RUNTIME_DIR: connection files of the kernels
      data/      JUPYTER_DATA_DIR
      ipython/   IPYTHONDIR

The server runs with ``sys.executable``: the project's environment, so the kernel it starts (the
``python3`` kernelspec resolves "python" to the server's interpreter) imports the mpviz under test.
The port is picked by binding port 0 and closing the socket; another program could take it in the
instant before Jupyter binds it, so a server that exits at once is retried on a fresh port.

Every process of the run inherits ``MPVIZ_BROWSER_TAG=<tag>`` in its environment (the server, its
kernels, whatever a kernel starts, the browser when launched with it), which is how
:func:`tagged_processes` finds anything the suite started that is still running.

``LabApp.expose_app_in_browser`` makes ``window.jupyterapp`` available to the page, so that the test
can read the notebook's model (execution counts, error outputs) instead of guessing from pixels;
Notebook 7 (a separate server extension, ``notebook.app.JupyterNotebookApp``, loaded by the same
server when the package is installed) has its own switch, ``JupyterNotebookApp.expose_app_in_browser``.
"""
import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

TAG_VAR = "MPVIZ_BROWSER_TAG"
READY_TIMEOUT = 60      # seconds for /api/status to answer (about 3 s on a quiet machine)
STOP_TIMEOUT = 30       # seconds for the server (and its kernels) to exit after SIGTERM

# Lab user settings (JUPYTER_CONFIG_DIR/lab/user-settings/<plugin package>/<plugin>.jupyterlab-settings)
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def free_port():
    """A TCP port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook7_installed():
    """Whether the ``notebook`` package (Notebook 7, served at /notebooks/... beside Lab) is here."""
    return importlib.util.find_spec("notebook") is not None


def tagged_processes(tag):
    """``{pid: command line}`` of the live (non-zombie) processes whose environment holds the tag."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


class LabServer:
    """One ``jupyter lab`` process serving `root_dir`; see the module docstring."""

    def __init__(self, root_dir, log_path, tag, tmp_dir):
        self.root_dir = str(root_dir)
        self.log_path = str(log_path)
        self.tag = tag
        self.tmp_dir = str(tmp_dir)
        self.token = secrets.token_hex(24)
        self.port = None
        self.proc = None

    # --- start -------------------------------------------------------------------------------

    def _environment(self):
        env = dict(os.environ)
        for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                         ("JUPYTER_DATA_DIR", "data"), ("IPYTHONDIR", "ipython")]:
            env[var] = os.path.join(self.tmp_dir, sub)
            os.makedirs(env[var], exist_ok=True)
        env.pop("JUPYTER_PATH", None)
        env.pop("JUPYTER_TOKEN", None)
        env[TAG_VAR] = self.tag
        settings_root = os.path.join(env["JUPYTER_CONFIG_DIR"], "lab", "user-settings")
        for plugin, values in LAB_SETTINGS.items():
            path = os.path.join(settings_root, plugin + ".jupyterlab-settings")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(values, f)
        return env

    def _command(self):
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
               "--ip=127.0.0.1", f"--port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.root_dir}",
               "--LabApp.expose_app_in_browser=True",
               "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate"]
        if notebook7_installed():
            cmd.append("--JupyterNotebookApp.expose_app_in_browser=True")
        if os.geteuid() == 0:
            cmd.append("--allow-root")  # Jupyter refuses to run as root without it
        return cmd

    def start(self, attempts=3):
        env = self._environment()
        for attempt in range(attempts):
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                log.write(f"--- attempt {attempt + 1}: port {self.port}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(self._command(), env=env, cwd=self.root_dir,
                                             stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT)
            if self._wait_ready():
                return self
            self.proc.wait()  # it exited by itself (or _wait_ready timed out and killed it)
            if "already in use" not in self.log_tail():
                break
        raise RuntimeError(f"JupyterLab did not start (exit code {self.proc.returncode}); "
                           f"its log ({self.log_path}) ends with:\n{self.log_tail()}")

    def _wait_ready(self):
        """True once /api/status answers; False if the server exited or READY_TIMEOUT passed."""
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)  # bounded poll of readiness: the server has no way to tell us
        self.proc.kill()
        return False

    # --- use ---------------------------------------------------------------------------------

    def url(self, path):
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""

    # --- stop --------------------------------------------------------------------------------

    def stop(self):
        """SIGTERM and wait: Jupyter shuts its kernels down before it exits. Returns a problem in
        words (it had to be killed), or None."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT)
            return None
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return f"the Jupyter server did not exit within {STOP_TIMEOUT} s of SIGTERM (killed)"
