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
"""
import atexit
import os
import sys

ENV_DIR = "MPVIZ_TRACE_DIR"
ENV_THREADING_LOCKS = "MPVIZ_TRACE_THREADING_LOCKS"


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
    hooks.install(threading_locks=os.environ.get(ENV_THREADING_LOCKS) == "1")
    __import__("mpviz.stepper.gate").stepper.gate.activate_from_env()  # a stepped run's child
    directory = os.environ.get(ENV_DIR)
    if directory and me == "program":
        if recorder.start(directory, "exec"):
            atexit.register(_record_exit)


def _record_exit():
    from .. import recorder
    if recorder.ENABLED:
        recorder.emit("process.exit", exitcode=None, how="atexit")


def site_directory():
    """The directory to put on PYTHONPATH so that every Python process calls boot()."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
