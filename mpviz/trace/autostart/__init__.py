"""Starting to record in a process that nobody asked: spawned children and traced programs.

Two doors lead here, and both call ``boot()`` as early as possible in a fresh interpreter:

1. ``hooks._spawnv_passfds`` puts ``...autostart.boot();`` in front of the ``-c`` program of every
   spawn child and fork server that a recording process starts (this works from a Jupyter cell:
   nothing needs to be set up before the kernel started).
2. ``python -m mpviz trace -- python script.py`` sets ``MPVIZ_TRACE_DIR`` and puts ``site/`` on
   ``PYTHONPATH``; the ``sitecustomize`` there calls ``boot()`` in *every* Python process of the
   program, before the program's first line.

``boot()`` looks at what this interpreter is (``sys.orig_argv``) and does the least that works::

    the resource tracker     nothing (it is plumbing, and it never unpickles user data)
    a fork server            hooks only: it records nothing, the children it forks start
                             recording in spawn.prepare (see hooks.py)
    a spawn child            hooks only: recording starts in spawn.prepare, with the directory
                             the parent put in the preparation data
    any other program        hooks, and recording into $MPVIZ_TRACE_DIR if that is set

And in each of them, when ``$MPVIZ_SCENARIO_STACKS`` names a folder (``mpviz trace`` sets it
unless ``--hang-after 0``), ``register_stacks()``: on SIGUSR1, faulthandler writes every thread's
Python stack to FOLDER/PID.txt -- how the hang watchdog (watchdog.py) sees where a stuck process
waits. The scenarios' ``_site/sitecustomize.py`` does the same for their runs.
"""
import atexit
import os
import sys

ENV_DIR = "MPVIZ_TRACE_DIR"
ENV_THREADING_LOCKS = "MPVIZ_TRACE_THREADING_LOCKS"
ENV_LAUNCHER = "MPVIZ_TRACE_LAUNCHER"   # the pid of `mpviz trace`, for its program to check
ENV_STACKS = "MPVIZ_SCENARIO_STACKS"     # the scenarios' runner uses the same variable
_stacks = None        # (fd, (st_dev, st_ino)) of the stacks file this process (or its parent) opened


def role():
    """What this interpreter is: resource_tracker, forkserver, spawn or program."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if "-c" in argv[:-1]:
        prog = argv[argv.index("-c") + 1]
        for name, marker in (("resource_tracker", "resource_tracker"),
                             ("forkserver", "forkserver import main"),
                             ("spawn", "spawn_main")):
            if marker in prog:
                return name
    return "program"


def boot():
    """Install the recording hooks in this interpreter (once); record if asked by the env."""
    from .. import hooks, recorder
    if hooks._booted:
        return
    me = role()
    if me == "resource_tracker":
        return
    hooks.mark_booted(me)
    if os.environ.get(ENV_STACKS) and not getattr(sys, "_mpviz_scenario_site", False):
        register_stacks()            # (a scenario's site has registered them already)
    hooks.install(threading_locks=os.environ.get(ENV_THREADING_LOCKS) == "1")
    __import__("mpviz.stepper.gate").stepper.gate.activate_from_env()  # a stepped run's child
    directory = os.environ.get(ENV_DIR)
    if directory and me == "program":
        if recorder.start(directory, "exec"):
            hooks.say_missing(directory)
            # (taken out of the environment: only the program the launcher started checks it)
            launcher = os.environ.pop(ENV_LAUNCHER, "")
            atexit.register(_record_exit, directory, launcher.isdigit() and int(launcher))
    from .. import torch_hooks      # real torch's sharing, once the program imports torch
    torch_hooks.watch()


def register_stacks():
    """On SIGUSR1, write all threads' Python stacks to $MPVIZ_SCENARIO_STACKS/PID.txt; a forked
    child registers again, with a file of its own. A program that sets its own SIGUSR1 handler
    replaces this one: the watchdog then says "(no stacks captured)" for it."""
    import faulthandler
    import signal
    global _stacks
    directory = os.environ.get(ENV_STACKS)
    if not directory or not os.path.isdir(directory):
        return
    old = _stacks
    try:
        fd = _open_stacks_file(os.path.join(directory, f"{os.getpid()}.txt"))
        try:
            faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True)
        except BaseException:
            os.close(fd)
            raise
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"mpviz.trace: pid {os.getpid()} cannot show its stacks to the hang watchdog "
              f"({exc})", file=sys.stderr)
        if old is not None:          # (a forked child: not into the parent's file, or the
            faulthandler.unregister(signal.SIGUSR1)  # program's file that took its number)
        return
    st = os.fstat(fd)
    _stacks = (fd, (st.st_dev, st.st_ino))
    if old is not None:
        _close_if_still(*old)         # a forked child: that one was the parent's
    else:
        os.register_at_fork(after_in_child=register_stacks)


# The stacks file is kept as a bare fd number, never a Python file object: a forked child must
# close its parent's stacks file, but by then the program may have closed that number
# (``os.closerange``, as a daemon does) and opened a file of its own that got it. Closing by
# number would take the program's file away (and the next file opened would get its number), so
# the number is closed only while it still names the file we opened -- the same (st_dev,
# st_ino) -- and a file object that closes its number when collected is never made.

def _open_stacks_file(path):
    """A new, private (0600), close-on-exec file at `path`; its fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


def _close_if_still(fd, identity):
    """Close `fd` if it still names the file whose (st_dev, st_ino) is `identity`."""
    try:
        st = os.fstat(fd)
    except OSError:
        return                       # closed already: nothing of ours there
    if (st.st_dev, st.st_ino) == identity:
        os.close(fd)


def _record_exit(directory, launcher):
    from .. import recorder
    if recorder.ENABLED:
        recorder.emit("process.exit", exitcode=None, how="atexit")
    if launcher and os.getppid() != launcher:     # re-parented: the launcher has gone
        print(f"mpviz trace: the launcher (pid {launcher}) is gone (killed?), so no trace.json "
              f"and no picture were written; the logs are in {directory}: "
              f"python -m mpviz trace --finish {directory} writes them", file=sys.stderr,
              flush=True)


def site_directory():
    """The directory to put on PYTHONPATH so that every Python process calls boot()."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
