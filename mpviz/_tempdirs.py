"""Temporary trace folders that do not pile up: removed at exit, or by the next run if we died.

A scenario, a traced notebook program or a ``record()`` block records into a new folder under the
system's temporary directory (``/tmp/mpviz-<what>-XXXXXXXX``, made 0700 by ``tempfile.mkdtemp``).
The process that made it removes it when it exits (``atexit``). But a Jupyter kernel that is
restarted, or a test run stopped with SIGKILL, runs no ``atexit``: its folders would stay for
ever (1,333 were found on one machine after a day of workshops and test runs).

So each folder holds an ``.owner`` file: the pid of the process that made it, that process's
start time (the two together name one process: a pid alone may be reused) and its pid namespace.
The next time any process of the same user makes such a folder, it first removes every folder
whose owner is gone::

    /tmp/mpviz-hogwild-3kx9ab1c/.owner   "4181 912345 pid:[4026531836]"
        -> process 4181, started at tick 912345, as the pid namespace 4026531836 numbers them
    same namespace as ours, and alive with that start time?   no -> the folder is removed

A folder made in another pid namespace (a container, or ``unshare --pid``, sharing this /tmp) is
left alone: its pid names another process here, or none, so nothing here can say whether its
maker still runs. Such folders go only at their maker's exit.

Only folders this user owns, that are real folders (not symlinks) and that hold our ``.owner``
are touched: another user's folders, a folder the user named with ``-o``, and anything else in
/tmp are never removed. A leaf: it imports nothing of mpviz but /proc's reader.
"""
import atexit
import os
import shutil
import stat as _stat
import tempfile

from . import _proc

OWNER = ".owner"
_made = []           # folders this process made: removed when it exits
_swept = False       # the sweep of dead owners' folders runs once per process


def make(prefix):
    """A new private folder ``<tmp>/<prefix>XXXXXXXX``, removed when this process exits (and by a
    later process if this one is killed first). `prefix` should start with "mpviz-"."""
    global _swept
    if not _swept:
        _swept = True
        sweep()
    directory = tempfile.mkdtemp(prefix=prefix)
    pid = os.getpid()
    with open(os.open(os.path.join(directory, OWNER), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                      0o600), "w") as f:
        f.write(f"{pid} {_proc.start_time(pid)} {_pid_namespace()}\n")
    _made.append(directory)
    return directory


def remove(directory):
    """Remove `directory` now (one :func:`make` gave), rather than at exit."""
    shutil.rmtree(directory, ignore_errors=True)
    if directory in _made:
        _made.remove(directory)


def _pid_namespace():
    """This process's pid namespace, as /proc names it ("pid:[4026531836]"); "?" if unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _owner_gone(directory):
    """True if the process named in `directory`'s .owner file is no longer running."""
    try:
        with open(os.path.join(directory, OWNER)) as f:
            pid, started, *namespace = f.read().split()
        pid = int(pid)
    except (OSError, ValueError):
        return False                     # not ours (no readable .owner): leave it alone
    if pid == os.getpid():
        return False
    if namespace and namespace != [_pid_namespace()]:
        return False                     # its pid numbers another namespace's process: unknown
    now = _proc.start_time(pid)
    return now is None or str(now) != started      # gone, or its pid now names another process


def sweep(root=None):
    """Remove this user's mpviz temporary folders whose owner process is gone. Returns them."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(root) if n.startswith("mpviz-")]
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not _stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue                     # a symlink, a file, or another user's: never ours
        if _owner_gone(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@atexit.register
def _remove_made():
    for directory in _made:
        shutil.rmtree(directory, ignore_errors=True)
