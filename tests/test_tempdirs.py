"""Temporary trace folders do not pile up: a folder whose maker was SIGKILLed is removed by the
next run; a live maker's folder, another user's, a symlink and a folder without our .owner stay."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from mpviz import _tempdirs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAKER = textwrap.dedent("""
    import os, sys, time
    import mpviz._tempdirs as t
    print(t.make("mpviz-test-sweep-"), flush=True)
    time.sleep(60)
""")


def _maker():
    child = subprocess.Popen([sys.executable, "-c", MAKER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
    return child, child.stdout.readline().strip()


def test_a_folder_whose_maker_was_sigkilled_is_removed_by_the_next_make():
    child, folder = _maker()
    try:
        assert os.path.isdir(folder) and os.stat(folder).st_mode & 0o777 == 0o700
        assert folder not in _tempdirs.sweep()          # its maker still runs: kept
        assert os.path.isdir(folder)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert os.path.isdir(folder)                        # SIGKILL: no atexit ran
    assert folder in _tempdirs.sweep()
    assert not os.path.exists(folder)


def test_a_folder_removed_at_exit_when_its_maker_ends_normally():
    done = subprocess.run([sys.executable, "-c", MAKER.replace("time.sleep(60)", "")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT},
                          timeout=60)
    folder = done.stdout.strip()
    assert folder.startswith("/") and not os.path.exists(folder)


def _dead_pid():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


def _folder(path, owner=None):
    """Make folder `path`, with an .owner naming process `owner` (started at tick 1) if given."""
    path.mkdir()
    if owner is not None:
        (path / _tempdirs.OWNER).write_text(f"{owner} 1\n")
    return path


def _can_unshare_pids():
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(os.geteuid() != 0 or not _can_unshare_pids(),
                    reason="needs root and unshare(1) to start a process in a pid namespace")
def test_a_live_makers_folder_from_another_pid_namespace_is_kept():
    # a container (or `unshare --pid`) sharing /tmp: its maker's pid (here 1 or 2) names
    # another process, or none, in this namespace; judged by it, the live folder was removed
    child = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                              MAKER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True)
    folder = ""
    try:
        folder = child.stdout.readline().strip()
        assert os.path.isdir(folder), folder
        assert folder not in _tempdirs.sweep()          # its maker runs, over there
        assert os.path.isdir(folder)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if folder:
            _tempdirs.remove(folder)


def test_the_sweep_leaves_symlinks_folders_without_owner_and_pid_reuse_with_other_start(tmp_path):
    dead = _dead_pid()
    stale = _folder(tmp_path / "mpviz-stale-1", dead)
    target = _folder(tmp_path / "elsewhere", dead)
    os.symlink(target, tmp_path / "mpviz-link-1")
    plain = _folder(tmp_path / "mpviz-0")                 # e.g. the shm manager's: no .owner
    me = _folder(tmp_path / "mpviz-mine-1", os.getpid())  # this process, alive
    mine_reused = _folder(tmp_path / "mpviz-reused-1", os.getppid())   # alive, other start tick
    removed = _tempdirs.sweep(str(tmp_path))
    assert sorted(removed) == sorted([str(stale), str(mine_reused)])
    assert target.exists() and (tmp_path / "mpviz-link-1").is_symlink()
    assert plain.exists() and me.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder owned by another uid")
def test_the_sweep_never_removes_another_users_folder(tmp_path):
    theirs = _folder(tmp_path / "mpviz-theirs-1", _dead_pid())
    os.chown(theirs, 65534, 65534)
    assert _tempdirs.sweep(str(tmp_path)) == []
    assert theirs.exists()


def test_scenario_and_record_folders_carry_an_owner_so_a_killed_kernel_leaves_nothing():
    import mpviz.scenarios as scenarios
    import mpviz.trace as mtrace
    running = scenarios.start("queue-sharing")
    try:
        assert os.path.isfile(os.path.join(running.trace_dir, _tempdirs.OWNER))
    finally:
        running.stop()
    with mtrace.record() as trace:
        folder = trace.path
        assert os.path.isfile(os.path.join(folder, _tempdirs.OWNER))
    assert not os.path.exists(folder)
