"""What a newcomer meets first: the names the README writes, the set-up commands, the CLI's Python.

Each check runs a fresh interpreter or the real ``./run`` script where what it tests is what
happens on first use (a lazily loaded name, a missing package, a venv made from nothing).
"""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh_python(code, **env):
    """Run `code` in a new interpreter that imports this checkout's mpviz; its stdout."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": ROOT, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_lazy_names_are_bound_on_first_use():
    """`mpviz.trace.mark(...)` as docs/PERFORMANCE.md writes it: the first access loads
    trace.py, every later one is a plain attribute of the module (no import run per event)."""
    out = fresh_python(
        "import mpviz\n"
        "t = mpviz.trace\n"
        "assert 'mark' not in vars(t), 'loaded lazily: import mpviz stays cheap'\n"
        "t.mark\n"
        "from mpviz.trace import trace as impl\n"
        "for name in ('mark', 'record', 'load', 'Trace'):\n"
        "    assert vars(t)[name] is getattr(impl, name), name\n"
        "print('ok')\n")
    assert out.strip() == "ok"


# -- ./run: the venv it makes, and what it installs -----------------------------------------------

def shell(script, cwd, user=None, env=None):
    """Run a bash `script` in `cwd` that may `source run` (its functions, without running main);
    as `user`'s uid when given (setpriv, as root). Returns (exit status, stdout + stderr)."""
    cmd = [shutil.which("bash"), "-c", script]          # found on this PATH, not on `env`'s
    if user is not None:
        cmd = [shutil.which("setpriv"), f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    result = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=60, env={**os.environ, **(env or {})})
    return result.returncode, result.stdout


@pytest.fixture
def checkout(tmp_path):
    """A copy of the files ./run reads (run, pyproject.toml), mpviz linked in, and a .venv whose
    python is the one running these tests (so nothing is installed from the network)."""
    for name in ("run", "pyproject.toml"):
        (tmp_path / name).write_bytes(open(os.path.join(ROOT, name), "rb").read())
    (tmp_path / "run").chmod(0o755)
    (tmp_path / "mpviz").symlink_to(os.path.join(ROOT, "mpviz"))
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return tmp_path


def test_run_reinstalls_when_pyproject_or_the_extras_change(checkout):
    """The stamp in .venv says for which pyproject.toml and with which extras mpviz was installed:
    the same again installs nothing; a new extra, or any change to pyproject.toml, installs."""
    code, out = shell(
        "source ./run\n"
        "installed notebooks && echo 'before any install: installed'\n"
        "remember browser,notebooks\n"
        "installed notebooks || echo 'notebooks: install'\n"
        "installed '' || echo 'mpviz alone: install'\n"
        "installed test,notebooks && echo 'test extra: installed'\n"
        "echo '# a change' >> pyproject.toml\n"
        "installed notebooks && echo 'after a change: installed'\n"
        "echo done\n", checkout)
    assert code == 0 and out.strip() == "done", out
    # and what ensure_venv installs after such a change: everything it had, plus what is asked
    code, out = shell("source ./run; merge_extras \"$(sed -n 2p .venv/.mpviz-installed)\" test",
                      checkout)
    assert out.strip() == "browser,notebooks,test", out


def test_run_mpviz_runs_the_cli_with_the_venvs_python(checkout, tmp_path_factory):
    code, out = shell("source ./run; remember ''; ./run mpviz list", checkout)
    assert code == 0, out
    assert "installing" not in out, "the stamp matched: nothing to install"
    assert "fork-held-lock" in out and "--start-method" in out
    # from another folder: the user's paths are the user's, and `python` is the venv's
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "which.py").write_text("import os, shutil; print('python is', "
                                        "shutil.which('python'))\n")
    code, out = shell(f"{checkout}/run mpviz trace -o out -- python which.py", elsewhere)
    assert code == 0, out
    assert f"python is {checkout}/.venv/bin/python" in out, out
    assert (elsewhere / "out").is_dir(), "the trace went where the user is"


def test_run_test_refuses_in_one_line_when_it_cannot_install_chromium(checkout):
    """Without chromium, and without root: one line that says which command to run, and how to
    skip the browser tests instead. (The absence of chromium is the only thing pretended here.)"""
    if os.geteuid() == 0:
        user = 65534                    # nobody: not root, and no sudo without a password
        os.chmod(checkout, 0o755)
        os.chmod(os.path.dirname(checkout), 0o755)
    elif subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        pytest.skip("this user has sudo without a password: ./run would install chromium")
    else:
        user = None
    script = "source ./run; have_chromium() { return 1; }; ensure_chromium; echo \"status $?\""
    browser = {"MPVIZ_SKIP_BROWSER": "0"}   # (the suite may run with the browser tests skipped)
    code, out = shell(script.replace("; echo", " || echo"), checkout, user=user, env=browser)
    lines = out.strip().splitlines()
    assert lines[-1] == "status 1", out
    assert len(lines) == 2, f"one line of explanation, not {len(lines) - 1}: {out}"
    assert "installing it needs root" in lines[0]
    assert "sudo apt-get install -y chromium" in lines[0]
    assert "MPVIZ_SKIP_BROWSER=1 ./run test" in lines[0]
    # where there is no apt-get at all: the same single line, naming MPVIZ_CHROMIUM
    code, out = shell(script.replace("; echo", " || echo"), checkout, user=user,
                      env={**browser, "PATH": str(checkout)})
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "no apt-get" in lines[0] and "MPVIZ_CHROMIUM" in lines[0], out
    # MPVIZ_SKIP_BROWSER=1: nothing to install, nothing said
    code, out = shell(script, checkout, user=user, env={"MPVIZ_SKIP_BROWSER": "1"})
    assert out.strip() == "status 0", out


INNER_TEST = """
import os
def test_waits_while_another_program_leaks_a_semaphore():
    with open(os.environ["READY_FIFO"], "w") as f:
        f.write("ready\\n")
    with open(os.environ["DONE_FIFO"]) as f:
        assert f.read() == "leaked\\n"
"""


def run_beside_a_leaking_program(checkout, command):
    """Run `command` (a bash line in `checkout` that starts this suite's conftest.py on one tiny
    test) while another program on the machine leaves a sem.mp-* in /dev/shm. Returns (the run's
    exit status, its output, the semaphore's name)."""
    (checkout / "test_inner.py").write_text(INNER_TEST)
    ready, done = checkout / "ready", checkout / "done"
    os.mkfifo(ready)
    os.mkfifo(done)
    name = f"mp-pythons-leak-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.path.join(ROOT, 'tests')}",
           "READY_FIFO": str(ready), "DONE_FIFO": str(done)}
    env.pop("MPVIZ_PRIVATE_SHM", None)                  # (this run's own namespace is not its)
    env.pop("MPVIZ_SKIP_SEMAPHORE_CHECK", None)
    inner = subprocess.Popen(
        [shutil.which("bash"), "-c", command], cwd=checkout, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        with open(ready) as f:
            assert f.read() == "ready\n"
        # another program, not the test run's: makes a named semaphore, exits, leaves it there
        subprocess.run([sys.executable, "-c", "import _multiprocessing; "
                        f"_multiprocessing.SemLock(1, 1, 1, '/{name}', False)"], check=True,
                       timeout=30)
        assert os.path.exists(f"/dev/shm/sem.{name}")
        with open(done, "w") as f:
            f.write("leaked\n")
        out, _ = inner.communicate(timeout=90)
    finally:
        inner.kill()
        inner.wait()
        if os.path.exists(f"/dev/shm/sem.{name}"):
            os.unlink(f"/dev/shm/sem.{name}")
    return inner.returncode, out, name


INNER_RUN = "-p conftest -p no:cacheprovider -o addopts= -q test_inner.py"


def test_run_test_runs_as_many_pytest_processes_as_mpviz_test_workers_says(checkout):
    """MPVIZ_TEST_WORKERS=2: pytest-xdist, each test file in one worker; 1: one process; unset:
    two where the machine has two cores, else one; a word that is not a number of processes is
    refused before anything is installed."""
    unset = "-n 2 --dist loadfile" if len(os.sched_getaffinity(0)) >= 2 else ""
    status, out = shell('source ./run; worker_args; echo "[$(MPVIZ_TEST_WORKERS=1 worker_args)]"'
                        '; echo "[$(unset MPVIZ_TEST_WORKERS; worker_args)]"', checkout,
                        env={"MPVIZ_TEST_WORKERS": "2"})
    assert status == 0 and out.splitlines() == ["-n 2 --dist loadfile", "[]", f"[{unset}]"], out
    status, out = shell("./run test", checkout,
                        env={"MPVIZ_TEST_WORKERS": "two", "MPVIZ_SKIP_BROWSER": "1"})
    assert status == 1 and "MPVIZ_TEST_WORKERS=two is not a number of processes" in out, out
    assert not (checkout / ".venv" / ".mpviz-installed").exists(), out


def test_a_test_run_passes_while_another_program_leaks_a_semaphore_beside_it(checkout):
    """The session's end-of-run check for leaked multiprocessing semaphores judges only what this
    run made: a run started as ./run test starts it (this suite's conftest.py, one tiny test)
    goes on while another program on the machine leaves a sem.mp-* in /dev/shm; it passes."""
    returncode, out, name = run_beside_a_leaking_program(
        checkout, f"source ./run; run_pytest {INNER_RUN}")
    assert returncode == 0 and "1 passed" in out, out
    assert "LEAK" not in out, out
    if os.geteuid() != 0:            # no private /dev/shm: it saw the semaphore, and says so
        assert "WARNING: 1 multiprocessing semaphore(s) appeared" in out and name in out, out
    else:                            # a private /dev/shm never sees it, or ./run said why not
        assert "WARNING" not in out or "./run: no private /dev/shm" in out, out


def test_a_private_dev_shm_claimed_by_hand_is_not_believed(checkout):
    """MPVIZ_PRIVATE_SHM=1 exported by hand (or inherited from another namespace) while the run
    shares /dev/shm with the machine: another program's semaphore is still a warning, not a
    LEAK that fails the run. Only ./run's own value, the name of the mount namespace in which it
    mounted a fresh /dev/shm, is believed."""
    returncode, out, name = run_beside_a_leaking_program(
        checkout, f"MPVIZ_PRIVATE_SHM=1 {sys.executable} -m pytest {INNER_RUN}")
    assert returncode == 0 and "1 passed" in out, out
    assert "LEAK" not in out, out
    assert "WARNING: 1 multiprocessing semaphore(s) appeared" in out and name in out, out


def test_run_test_says_why_when_root_cannot_mount_a_private_dev_shm(checkout, tmp_path_factory):
    """As root where mounting is refused (a container's policy; here a `mount` that fails is the
    only thing pretended): ./run says in one line that this run has no private /dev/shm and what
    that means, and the run goes on, judging the semaphores it sees with a warning."""
    if os.geteuid() != 0:
        pytest.skip("./run tries a private /dev/shm only as root")
    bin_dir = tmp_path_factory.mktemp("refusing-mount")
    (bin_dir / "mount").write_text("#!/bin/sh\necho 'mount: /dev/shm: permission denied.' >&2\n"
                                   "exit 32\n")
    (bin_dir / "mount").chmod(0o755)
    returncode, out, name = run_beside_a_leaking_program(
        checkout, f"PATH={bin_dir}:$PATH; source ./run; run_pytest {INNER_RUN}")
    assert returncode == 0 and "1 passed" in out, out
    assert "./run: no private /dev/shm for this test run (mounting a tmpfs there failed: " \
           "mount: /dev/shm: permission denied.)" in out, out
    assert "LEAK" not in out, out
    assert "WARNING: 1 multiprocessing semaphore(s) appeared" in out and name in out, out


def test_plot_without_matplotlib_is_an_error():
    """`mpviz run ... --plot` in a Python without matplotlib (the system one, say): the verdict,
    then one clear error and a non-zero exit, not a silent 0."""
    result = subprocess.run(
        [sys.executable, "-c",
         "import sys, runpy\n"
         "sys.modules['matplotlib'] = None   # what a Python without matplotlib has\n"
         "sys.argv = ['mpviz', 'run', 'queue-sharing', '--plot', 'never.png']\n"
         "runpy.run_module('mpviz', run_name='__main__')\n"],
        cwd=ROOT, capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "queue-sharing" in result.stdout and "OK" in result.stdout   # the verdict stands
    assert "cannot draw never.png" in result.stderr and "Fix:" in result.stderr
    assert "./run mpviz run" in result.stderr
    assert not os.path.exists(os.path.join(ROOT, "never.png"))


@pytest.mark.timeout(150)
def test_workshop_prints_the_first_notebook_and_stops_at_one_ctrl_c(checkout, tmp_path_factory):
    """`./run workshop` on a terminal, as a student starts it: the URL it prints is 00_overview's,
    and a single Ctrl-C (SIGINT to the terminal's process group) stops it without a question."""
    pytest.importorskip("jupyterlab")
    import pty
    import re
    import select
    import signal
    import time
    (checkout / "notebooks").symlink_to(os.path.join(ROOT, "notebooks"))
    jupyter = checkout / ".venv" / "bin" / "jupyter"
    jupyter.write_text(f'#!/bin/sh\nexec {sys.executable} -m jupyter "$@"\n')
    jupyter.chmod(0o755)
    shell("source ./run; remember notebooks", checkout)
    home = tmp_path_factory.mktemp("jupyter")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "BROWSER": "true",
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTER_DATA_DIR": str(home / "data")}
    master, slave = pty.openpty()
    proc = subprocess.Popen(["./run", "workshop", "--no-browser", "--port=0"], cwd=checkout,
                            env=env, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    seen = b""

    def read_for(seconds, until=None):
        nonlocal seen
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and until in seen):
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:                  # the terminal closed: the server has gone
                    return
    try:
        read_for(90, until=b"token=")
        urls = set(re.findall(rb"http://[^\s]+token=\w+", seen))
        assert urls, seen.decode(errors="replace")[-2000:]
        assert all(b"/lab/tree/00_overview.ipynb?token=" in u for u in urls), urls
        os.killpg(proc.pid, signal.SIGINT)       # what one Ctrl-C on the terminal sends
        proc.wait(20)                            # TimeoutExpired: it asked "Shut down? (y/[n])"
        assert b"Shut down this Jupyter server" not in seen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)


def test_plot_with_matplotlib_draws_and_exits_0(tmp_path):
    png = tmp_path / "t.png"
    result = subprocess.run([sys.executable, "-m", "mpviz", "run", "queue-sharing", "--plot",
                             str(png)], cwd=ROOT, capture_output=True, text=True, timeout=90,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stdout + result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"timeline: {png}" in result.stdout
