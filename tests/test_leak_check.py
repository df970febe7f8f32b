"""The leak check's own eyes (tests/conftest.py): after every test it asks ``children()`` for
this process's live children, and fails the test if one is left. ``children()`` reads each
thread's /proc/self/task/TID/children rather than every process's stat on the machine; these
tests hold it to what the full scan sees, for the children the suite's tests leave behind."""
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import _children_by_scan, alive, children
from mpviz import _proc


def _started_in_a_thread_that_ends():
    """A child started by a thread that has ended since (the kernel hands the child to another
    thread of this process): its Popen."""
    box = []
    t = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "60"])))
    t.start()
    t.join()
    return box[0]


def test_a_live_child_is_seen_whichever_thread_started_it_and_a_reaped_one_is_not():
    mine = subprocess.Popen(["sleep", "60"])
    orphaned = _started_in_a_thread_that_ends()
    box, checked = [], threading.Event()

    def start_and_stay():                  # a thread that lives on while we look
        box.append(subprocess.Popen(["sleep", "60"]))
        checked.wait(30)
    t = threading.Thread(target=start_and_stay)
    t.start()
    done = subprocess.Popen(["true"])
    try:
        while not box and t.is_alive():   # polling the thread's start, bounded by its join below
            time.sleep(0.01)
        ours = {mine.pid, orphaned.pid, box[0].pid}
        assert ours <= set(children())
        done.wait()
        assert done.pid not in children()
        assert sorted(children()) == sorted(_children_by_scan())
    finally:
        checked.set()
        t.join()
        for p in [mine, orphaned] + box:
            p.kill()
            p.wait()
    assert not ours & set(children())


def test_a_zombie_child_is_not_counted_as_alive():
    """A child that has exited but is not reaped yet is gone for the check (nothing runs)."""
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:     # polling for its exit, bounded
        with open(f"/proc/{zombie.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    try:
        assert zombie.pid not in children() and zombie.pid not in _children_by_scan()
    finally:
        zombie.wait()


INNER_TEST = """
import os, subprocess, time

def test_leaves_a_child_that_has_a_child_of_its_own():
    subprocess.Popen(["sh", "-c", "sleep 60 & echo $! > grandchild.pid; wait"])
    deadline = time.monotonic() + 10
    while not os.path.exists("grandchild.pid") and time.monotonic() < deadline:
        time.sleep(0.01)                   # polling for the shell's start, bounded
"""


def test_a_leaked_child_is_killed_with_its_own_children(tmp_path):
    """The leak check kills a child a test left running. Its own children (a launcher's
    program, a shell's background job) must go with it: killed alone, it leaves them to init,
    running on with nobody to see them."""
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tests, os.path.dirname(tests)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        MPVIZ_SKIP_SEMAPHORE_CHECK="1")
    inner = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p",
                            "no:cacheprovider", "-o", "addopts=", "-q", "test_inner.py"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    try:
        assert "leak after test: child processes still alive (now killed): [" in inner.stdout, \
            inner.stdout
        assert f"and their own children [{grandchild}] (killed too)" in inner.stdout, inner.stdout
        deadline = time.monotonic() + 5
        while alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.01)               # polling for init to reap it, bounded
        assert not alive(grandchild), "the leaked child's own child is still running"
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _orphaned_sleeper():
    """The pid of a `sleep 60` whose parent has exited: an orphan, handed to this process."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess\n"
         "kid = subprocess.Popen(['sleep', '60'])\nprint(kid.pid, flush=True)\nos._exit(0)"],
        stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    parent.wait()
    parent.stdout.close()
    return pid


def test_a_grandchild_orphaned_by_its_parents_death_is_seen_as_this_runs_child():
    """A test that kills a worker's parent leaves the worker behind: it is handed to pytest (a
    child subreaper, see conftest), so the leak check sees it rather than init adopting it."""
    import conftest
    assert conftest.SUBREAPER, "prctl(PR_SET_CHILD_SUBREAPER) failed: orphans would go unseen"
    grandchild = _orphaned_sleeper()
    try:
        deadline = time.monotonic() + 10
        while grandchild not in children() and time.monotonic() < deadline:
            time.sleep(0.01)            # polling the kernel's reparenting, bounded
        assert grandchild in children()
        assert grandchild in _children_by_scan()
    finally:
        os.kill(grandchild, signal.SIGKILL)
        os.waitpid(grandchild, 0)       # ours now: reaped here, as a parent must


def test_an_orphan_this_run_adopted_is_reaped_when_it_dies_and_a_childs_own_wait_is_kept():
    """pytest adopts orphans (a subreaper), so it must reap them as init would: the processes
    of a program that mpviz killed for a hang were left as zombies, 10-25 per test file. A
    child that its owner will still wait for (a multiprocessing Process not yet joined) is not
    reaped: its own join must get its exit status."""
    import multiprocessing

    import conftest
    orphan = _orphaned_sleeper()
    mine = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
    mine.start()
    try:
        deadline = time.monotonic() + 10
        while orphan not in children() and time.monotonic() < deadline:
            time.sleep(0.01)            # polling the kernel's reparenting, bounded
        os.kill(orphan, signal.SIGKILL)
        while (_proc.stat(orphan).state != "Z" or _proc.stat(mine.pid).state != "Z") and \
                time.monotonic() < deadline:
            time.sleep(0.01)            # polling for both to die, bounded
        assert conftest.reap_orphans() == [orphan]
        assert _proc.stat(orphan) is None           # gone from /proc: reaped
        mine.join()
        assert mine.exitcode == 3                   # its own wait got its status
    finally:
        if _proc.stat(orphan) is not None:
            os.kill(orphan, signal.SIGKILL)
            os.waitpid(orphan, 0)
