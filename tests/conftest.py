"""Shared fixtures: start methods, sharing strategies, and a leak check after every test.

The leak check (torch's ``leak_checker`` idea): after each test there must be no
``/dev/shm/mpviz_*`` entries, no file descriptors this process did not have before (apart from
the few mpviz keeps open on purpose: its fd server's listener, its live peer connections and its
shm manager connection), and no live child processes. (Entries that were already in /dev/shm
before the test are not its own: another test run on the same machine may have made them.) Cleanup is asynchronous in places (a
killed holder's segment is removed by the manager within ~1 s), so the check polls for a
bounded time before it fails.
"""
import gc
import multiprocessing
import os
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so spawned children can import tests' workers
# Name this run's /dev/shm segments mpviz_<tag>_…, so that the leak check sees only its own even
# when another test run shares the machine. Children inherit it; set before mpviz is imported.
# Under pytest-xdist (`-n 2`) each worker is a pytest process of its own, and inherits the tag
# of the process that started it (MPVIZ_TEST_RUN_TAG says which it is): each takes one of its
# own (and so its own shm manager), so that one worker's leak check never sees the other's
# segments. A program a test starts keeps the tag it is given, even if it imports this file.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER and os.environ.get("MPVIZ_SHM_TAG") == os.environ.get("MPVIZ_TEST_RUN_TAG"):
    os.environ["MPVIZ_SHM_TAG"] = f"t{os.getpid()}{XDIST_WORKER}_"
os.environ.setdefault("MPVIZ_SHM_TAG", f"t{os.getpid()}_")
os.environ.setdefault("MPVIZ_TEST_RUN_TAG", os.environ["MPVIZ_SHM_TAG"])
SHM_PREFIX = "mpviz_" + os.environ["MPVIZ_SHM_TAG"]

import mpviz  # noqa: E402
from mpviz import _proc  # noqa: E402
import mpviz.multiprocessing as mp  # noqa: E402
from mpviz.sharing import fd_passing, shm_manager  # noqa: E402

START_METHODS = multiprocessing.get_all_start_methods()


@pytest.fixture(params=START_METHODS)
def start_method(request):
    """Each test body runs once per start method: fork, spawn, forkserver."""
    return request.param


@pytest.fixture
def ctx(start_method):
    return mp.get_context(start_method)


@pytest.fixture(params=sorted(mp.get_all_sharing_strategies()))
def strategy(request):
    """Each test body runs once per sharing strategy; restored afterwards."""
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy(request.param)
    yield request.param
    mp.set_sharing_strategy(old)


def hooked_torch():
    """torch, where mpviz trace hooks it (torch_hooks.version_supported); else the test is
    skipped, saying why. For module fixtures that run torch programs under the recorder."""
    torch = pytest.importorskip("torch")
    from mpviz.trace.torch_hooks import SUPPORTED, version_supported
    if not version_supported(torch.__version__):
        pytest.skip(f"the torch hooks know torch {SUPPORTED} only")
    return torch


# -- orphans are this run's children too ----------------------------------------------------------
# A process whose parent dies is handed to the nearest "child subreaper" above it, else to init.
# The pytest process makes itself one, so that a grandchild a test leaves behind (a worker whose
# parent was killed, a daemon that double-forked) becomes pytest's child, and the leak check after
# each test sees it (before this, it saw only direct children: orphans went to init, unseen).
# Not inherited: the children pytest starts reparent their own orphans as before. The shm
# manager's daemon is the one orphan made on purpose (it outlives tests, as it outlives notebooks).
def _become_subreaper():
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0          # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


SUBREAPER = _become_subreaper()


def reap_orphans():
    """Reap the zombies among this process's children that nothing here will wait for, and
    return their pids: the orphans it adopted as the subreaper -- above all the processes of a
    program that mpviz killed for a hang (``mpviz trace``, ``record(hang_after=...)``), whose
    parent died first. init reaps such orphans; a subreaper that does not leaves them as
    zombies (10-25 per test file, before this). Only a zombie is reaped, each by its pid
    (never ``waitpid(-1)``), and not one that multiprocessing (a Process not yet joined) or a
    module's fixture (KEPT_ALIVE) will still wait for: their own wait must get its status."""
    if not SUBREAPER:
        return []
    theirs = KEPT_ALIVE | {p.pid for p in list(multiprocessing.process._children)
                           if p.pid is not None}
    reaped = []
    for pid in _child_pids():
        st = _proc.stat(pid)
        if st is not None and st.state == "Z" and st.ppid == os.getpid() and pid not in theirs:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except ChildProcessError:      # reaped meanwhile by whoever waits for it
                pass
    return reaped


def _long_lived_daemons(pids):
    """Of `pids`, the shm manager daemons (started once, kept on purpose: see shm_manager.py)."""
    kept = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if any(w.endswith(b"shm_manager.py") for w in words) and b"--serve" in words:
            kept.add(pid)
    return kept


def shm_entries():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(SHM_PREFIX))


def open_fds():
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")  # the directory listing's own fd is gone by now
            fds.add(int(fd))
        except OSError:
            pass
    return fds


def children():
    """This process's live (not zombie) children. Each thread's /proc/self/task/TID/children
    lists the children it started (a thread that ends hands its own to another thread of the
    process), so this reads a few small files, not every process's stat on the machine: that
    scan cost 5-25 ms per test on a busy machine, and the leak check runs after every test.
    A kernel without those files (CONFIG_PROC_CHILDREN off) gets the scan."""
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
        return _children_by_scan()
    return [pid for pid in _child_pids() if alive(pid)]


def _child_pids():
    """This process's children, zombies included (each thread's children file)."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                found += [int(pid) for pid in f.read().split()]
        except OSError:                  # the thread ended meanwhile
            continue
    return found


def alive(pid):
    """Whether process `pid` runs: it exists (not reaped) and is not a zombie."""
    return _proc.alive(_proc.stat(pid))


def _descendants(pid):
    """The live process `pid`'s children, theirs, and so on (each thread's children file, as
    children() reads its own): what goes on running if only `pid` is killed."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:                      # gone, or a kernel without the files
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(kid) for kid in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid] + _descendants(kid)
    return found


def _children_by_scan():
    """children(), by reading the parent pid of every process on the machine."""
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.append(int(pid))
    return found


def _stdlib_helpers():
    """The forkserver and resource tracker: long-lived helpers stdlib starts once per session."""
    from multiprocessing import forkserver, resource_tracker
    pids, fds = set(), set()
    fs = forkserver._forkserver
    if getattr(fs, "_forkserver_pid", None):
        pids.add(fs._forkserver_pid)
    if getattr(fs, "_forkserver_alive_fd", None) is not None:
        fds.add(fs._forkserver_alive_fd)
    rt = resource_tracker._resource_tracker
    if getattr(rt, "_pid", None):
        pids.add(rt._pid)
    if getattr(rt, "_fd", None) is not None:
        fds.add(rt._fd)
    return pids, fds


# Processes that a module-scoped fixture keeps running across its tests on purpose (the browser
# tests' one JupyterLab server and Playwright driver per module). The leak check after each test
# does not count them as that test's children; the fixture that started them adds them here,
# removes them when it stops them, and checks itself that they (and what they started) are gone.
KEPT_ALIVE = set()


def _expected_fds():
    return (fd_passing.infrastructure_fds() | shm_manager.infrastructure_fds()
            | _stdlib_helpers()[1] | _heap_arena_fds())


def _heap_arena_fds():
    """The stdlib's shared heap (multiprocessing.heap: RawValue, RawArray) keeps each arena's
    file open for the life of the process, on purpose, as matplotlib keeps its font file. (An
    mpviz Event's sleepers' slots, a memfd, are not among them: they go with their Event, and
    an Event that outlives its test is a leak. tests/test_widgets.py closes its widgets, which
    would otherwise keep their Live's Event alive in ipywidgets' registry.)"""
    prefix = f"/dev/shm/pym-{os.getpid()}-"    # (the arena's fd, and its mmap's own copy)
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                fds.add(int(fd))
        except OSError:
            pass
    return fds


@pytest.fixture(scope="session")
def fonts_loaded():
    """matplotlib opens (and keeps open) a font file the first time it needs it, which the
    per-test leak check would count: draw every kind of text these pictures use, once."""
    import io

    from mpviz.viz.figure import Figure
    fig = Figure()
    ax = fig.add_subplot()
    ax.text(0, 0, "✗ ▸ ≈ → ← └ ▼ plain")
    ax.text(0, 1, "✗ ▸ bold", fontweight="bold")
    fig.savefig(io.BytesIO(), format="png")


@pytest.fixture(autouse=True)
def fresh_autograd_engine():
    """Each test starts with an autograd engine that has not "started its device threads": a
    test that ran backward() with (simulated) CUDA in use would otherwise leave this process
    marked, and every later test's forked child would refuse backward() (torch's rule, which
    mpviz.autograd follows: right for one program, wrong across unrelated tests)."""
    yield
    autograd = sys.modules.get("mpviz.autograd")
    if autograd is not None:
        autograd._device_threads_started = False


def pytest_collection_finish(session):
    """Freeze what collection made (pytest's items, the test modules, mpviz, numpy, torch,
    matplotlib: some 200,000 objects) out of the garbage collector's sight. The leak check
    below calls gc.collect() at least twice per test so that a test's cyclic garbage lets its
    fds and segments go; without this, each call walked all of those long-lived objects too
    (0.1-0.3 s each: minutes over the suite). Objects a test creates are not frozen, so its
    garbage is collected as before; what is frozen is only ever freed by its reference count."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def leak_check(request):
    if request.node.get_closest_marker("no_leak_check"):
        yield
        return
    shm_before = set(shm_entries())  # normally empty; another test run on the machine may add some
    gc.collect()
    before = open_fds() - _expected_fds()
    yield
    deadline = time.monotonic() + 5
    while True:
        multiprocessing.active_children()  # joins finished children
        gc.collect()
        fd_passing.sweep()
        leaked_fds = open_fds() - before - _expected_fds()
        leaked_shm = sorted(set(shm_entries()) - shm_before)
        live = [pid for pid in children() if pid not in _stdlib_helpers()[0] | KEPT_ALIVE]
        live = [pid for pid in live if pid not in _long_lived_daemons(live)]
        if not (leaked_fds or leaked_shm or live) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # polling for asynchronous cleanup, bounded; not synchronisation
    reap_orphans()
    theirs = [kid for pid in live for kid in _descendants(pid)]   # (before they are orphaned)
    for pid in live + theirs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    details = []
    if leaked_shm:
        details.append(f"/dev/shm entries left: {leaked_shm}")
    if leaked_fds:
        links = {}
        for fd in leaked_fds:
            try:
                links[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                links[fd] = "?"
        details.append(f"file descriptors left open: {links}")
    if live:
        details.append(f"child processes still alive (now killed): {live}"
                       + (f", and their own children {theirs} (killed too)" if theirs else ""))
    if details:
        pytest.fail("leak after test: " + "; ".join(details), pytrace=False)


# -- the whole session: multiprocessing's named semaphores ----------------------------------------
# Locks, queues and events of the spawn/forkserver contexts are named semaphores in /dev/shm
# (sem.mp-*), removed when their object is collected or, after a crash, by the stdlib's resource
# tracker. A notebook kernel that is killed (nbval and the browser tests stop kernels that way)
# takes its tracker with it, so whatever it still held stays in /dev/shm. Check, once at the end,
# that this run left none: the notebooks' cleanup cells must let such objects go.
#
# A run judges only itself. A semaphore's name does not say who made it, and other programs on a
# shared machine leave theirs in /dev/shm too. `./run test` as root gives the run a private
# /dev/shm (its own mount namespace, see ./run): there every new entry is the run's, and one left
# is a failure. Anywhere else the run cannot tell its own from another program's: a new one left
# is named in a warning, and the run's exit status is not changed.

def _semaphores():
    return {f for f in os.listdir("/dev/shm") if f.startswith("sem.mp-")}


def private_dev_shm():
    """True when this run has /dev/shm to itself: ./run mounted a tmpfs there in a mount
    namespace of the run's own, and said so by putting that namespace's name in
    MPVIZ_PRIVATE_SHM. Any other value (set by hand, or inherited from another namespace) is
    not believed: this run then shares /dev/shm with the machine."""
    try:
        return os.environ.get("MPVIZ_PRIVATE_SHM") == os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False


def _mapped_somewhere(names):
    mapped = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/maps") as f:
                    text = f.read()
            except OSError:
                continue
            mapped |= {n for n in names if n in text}
    return mapped


def pytest_sessionstart(session):
    session.config._mpviz_semaphores = _semaphores()


# Which test left it: with /dev/shm private, each process of the run (pytest's, or each
# pytest-xdist worker) notes after every test -- a notebook's cells too -- the semaphores it sees
# for the first time, one line "name nodeid" in a file of the private /dev/shm (gone with the
# run's mount namespace), so that a LEAK below names the test after which it first appeared.
# (A plugin, not a hook of this conftest: a conftest's per-test hooks see only the tests under
# its folder, and the notebooks' cells are where kernels are killed.)
_SEEN_FILE = "/dev/shm/mpviz-test-semaphores-seen"


class _SemaphoreNotes:
    def __init__(self):
        self.seen = set()

    def pytest_sessionstart(self, session):
        self.seen = _semaphores()                # (not this run's)

    def pytest_runtest_logfinish(self, nodeid, location):
        if not private_dev_shm():
            return
        new = _semaphores() - self.seen
        if new:
            self.seen.update(new)
            fd = os.open(_SEEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                         0o600)
            with os.fdopen(fd, "a") as f:
                f.write("".join(f"{name} {nodeid}\n" for name in sorted(new)))


def pytest_configure(config):
    config.pluginmanager.register(_SemaphoreNotes(), "mpviz-semaphore-notes")


def _first_seen_after(names):
    """{test nodeid: [semaphores first seen after it]}, from every process's notes."""
    try:
        with open(_SEEN_FILE) as f:
            lines = [line.split(" ", 1) for line in f.read().splitlines()]
    except OSError:
        return {}
    where = {}
    for name, nodeid in lines:
        if name in names and name not in {n for ns in where.values() for n in ns}:
            where.setdefault(nodeid, []).append(name)
    return where


def pytest_sessionfinish(session, exitstatus):
    # (under pytest-xdist the process that started the workers checks, once all have ended: a
    # worker that ends first would see the other's semaphores come and go)
    if os.environ.get("MPVIZ_SKIP_SEMAPHORE_CHECK") == "1" or hasattr(session.config,
                                                                        "workerinput"):
        return
    new = _semaphores() - getattr(session.config, "_mpviz_semaphores", set())
    deadline = time.monotonic() + 1
    while new and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the stdlib tracker's cleanup after the last kernel, bounded
        new &= _semaphores()
    if new:
        new -= _mapped_somewhere(new)   # still in use by a live process: not (yet) a leak
    if not new:
        return
    writer = session.config.get_terminal_writer()
    writer.line()
    if private_dev_shm():
        writer.line(
            f"LEAK: this test run left {len(new)} multiprocessing semaphore(s) in its private "
            f"/dev/shm that no live process maps: {sorted(new)[:5]}... A killed process (a "
            f"notebook kernel?) still held spawn-context Locks/Queues/Events.", red=True)
        for nodeid, names in sorted(_first_seen_after(new).items()):
            writer.line(f"  {len(names)} first seen after {nodeid}: {sorted(names)[:3]}", red=True)
        session.exitstatus = 1
    else:
        writer.line(
            f"WARNING: {len(new)} multiprocessing semaphore(s) appeared in /dev/shm during this "
            f"run and no live process maps them: {sorted(new)[:5]}... This run shares /dev/shm "
            f"with the machine's other programs, so it cannot tell whether it left them (a "
            f"killed notebook kernel holding spawn-context Locks/Queues/Events) or another "
            f"program did; not counted as a failure. `./run test` as root runs the suite with a "
            f"private /dev/shm, where a semaphore left is this run's and fails it."
            + (" (MPVIZ_PRIVATE_SHM is set, but not by ./run for this run's mount namespace: "
               "not believed.)" if os.environ.get("MPVIZ_PRIVATE_SHM") else ""), yellow=True)
