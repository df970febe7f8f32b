"""Starting to record in a process that nobody asked: spawned children and traced programs.

Two doors lead here, and both call ``boot()`` as early as possible in a fresh interpreter:

1. ``hooks._spawnv_passfds`` puts ``...autostart.boot();`` in front of the ``-c`` program of every
   spawn child and fork server that a recording process starts (this works from a Jupyter cell:
   nothing needs to be set up before the kernel started).
2. ``python -m mpviz trace -- python script.py`` sets ``MPVIZ_TRACE_DIR`` and puts ``site/`` on
   ``PYTHONPATH``; the ``sitecustomize`` there calls ``boot()`` in *every* Python process of the
   program, before the program's first line.

``boot()`` looks at what this interpreter is (``sys.orig_argv``) and does the least that works::

    the resource tracker     no hooks (plumbing); after mpviz kills the program, its
                             cleanup said in mpviz's words, not as a leak (tracker_words)
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
import importlib
import os
import sys

ENV_DIR = "MPVIZ_TRACE_DIR"
ENV_THREADING_LOCKS = "MPVIZ_TRACE_THREADING_LOCKS"
ENV_LAUNCHER = "MPVIZ_TRACE_LAUNCHER"   # the pid of `mpviz trace`, for its program to check
ENV_STACKS = "MPVIZ_SCENARIO_STACKS"     # the scenarios' runner uses the same variable
# A hook slot: "mpviz.MODULE:FUNCTION" (or several, comma-separated), called once the hooks are
# in. Whoever starts a run puts its own here; the recorder imports nobody above it (the stepper
# names mpviz.stepper.gate's activate_from_env, so each spawned child of a stepped run steps
# itself). Only mpviz's own functions: any other entry is said and skipped (see _on_boot).
ON_BOOT = "MPVIZ_ON_BOOT"
KILLED_MARK = "killed-by-mpviz"         # in the stacks folder: mpviz is killing the program
TRACKER_SUFFIX = ".tracker.txt"         # what a tracker removed after that kill ("2 semaphore")
_stacks_file = None
_interrupt_file = None
_crash_file = None                      # ours while faulthandler.enable() writes into it
INTERRUPT_SUFFIX = ".int.txt"           # where a process's stacks at a SIGINT go
CRASH_SUFFIX = ".crash.txt"             # faulthandler's report of a crash (SIGSEGV ...)


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
    if sys.modules.get("mpviz.trace.hooks") and sys.modules["mpviz.trace.hooks"]._booted:
        return
    me = role()
    if me == "resource_tracker":
        if os.environ.get(ENV_STACKS):
            tracker_words(os.environ[ENV_STACKS])
        return
    directory = os.environ.get(ENV_DIR)
    if directory and me == "program":
        # Registered before multiprocessing is imported (the hooks import it), because atexit
        # runs its functions last-registered first: multiprocessing's own exit function
        # (which joins the children and the queues' feeder threads, and can hang there) then
        # runs before this one, and the process's recorded end comes after it, not before.
        # (Taken out of the environment: only the program the launcher started checks it.)
        launcher = os.environ.pop(ENV_LAUNCHER, "")
        atexit.register(_record_exit, directory, launcher.isdigit() and int(launcher))
    from .. import hooks, recorder
    hooks.mark_booted(me)
    if os.environ.get(ENV_STACKS) and not getattr(sys, "_mpviz_scenario_site", False):
        register_stacks()            # (a scenario's site has registered them already)
    hooks.install(threading_locks=os.environ.get(ENV_THREADING_LOCKS) == "1")
    for call in _on_boot():                                            # see ON_BOOT
        call()
    if directory and me == "program":
        if recorder.start(directory, "exec"):
            hooks.say_missing(directory)
    from .. import torch_hooks      # real torch's sharing, once the program imports torch
    torch_hooks.watch()


def _on_boot():
    """The functions ``ON_BOOT`` names. An entry that is not one of mpviz's own functions (a
    leftover shell export, a typo) is said on stderr and skipped: it must not stop this process
    from recording, nor run code that is not mpviz's."""
    calls = []
    for entry in filter(None, os.environ.get(ON_BOOT, "").split(",")):
        module, _, function = entry.partition(":")
        why = None
        if not (module.startswith("mpviz.") and function.isidentifier()):
            why = "it must name one of mpviz's own functions, as 'mpviz.MODULE:FUNCTION'"
        else:
            try:
                call = getattr(importlib.import_module(module), function)
            except (ImportError, AttributeError) as exc:
                call, why = None, f"no such function ({exc})"
            if callable(call):
                calls.append(call)
            elif why is None:
                why = f"{function} is not a function"
        if why:
            print(f"mpviz.trace: {ON_BOOT}={entry!r} skipped in pid {os.getpid()}: {why}. Only "
                  f"mpviz sets it (mpviz.step, for the processes of a stepped run). Fix: unset "
                  f"{ON_BOOT}.", file=sys.stderr)
    return calls


def register_stacks():
    """On SIGUSR1, write all threads' Python stacks to $MPVIZ_SCENARIO_STACKS/PID.txt; a forked
    child registers again, with a file of its own. A program that sets its own SIGUSR1 handler
    replaces this one: the watchdog then says "(no stacks captured)" for it.

    And on SIGINT (Ctrl-C), the same into PID.int.txt, then Python's own handler runs as always
    (``chain``: the KeyboardInterrupt comes as it would). A terminal, or Jupyter's "interrupt",
    sends SIGINT to every process of the group at once: by the time ``record()``'s process asks
    its children for their stacks, they are already unwinding. This file holds where each was at
    the interrupt itself (``watchdog.interrupt_stacks`` reads it). A program that sets its own
    SIGINT handler (a Pool initializer ignoring it, say) replaces this one.

    And on a crash in native code (SIGSEGV, SIGABRT ...), faulthandler's report -- "Fatal
    Python error: Segmentation fault" and every thread's stack -- into PID.crash.txt, as the
    process dies: how a child ended that no recorded process waits for (the fork server reaps
    its children itself), and the line that crashed (``crash_report`` reads it). Not where the
    program enabled faulthandler itself: its report stays where the program sends it."""
    import faulthandler
    import signal
    global _stacks_file, _interrupt_file, _crash_file
    directory = os.environ.get(ENV_STACKS)
    if not directory or not os.path.isdir(directory):
        return
    old = (_stacks_file, _interrupt_file, _crash_file)
    try:
        _stacks_file = _open_own(os.path.join(directory, f"{os.getpid()}.txt"))
        faulthandler.register(signal.SIGUSR1, file=_stacks_file[0], all_threads=True)
        if _crash_file is not None or not faulthandler.is_enabled():
            _crash_file = _open_own(os.path.join(directory, f"{os.getpid()}{CRASH_SUFFIX}"))
            faulthandler.enable(file=_crash_file[0], all_threads=True)
        _interrupt_file = None
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            _interrupt_file = _open_own(os.path.join(directory,
                                                     f"{os.getpid()}{INTERRUPT_SUFFIX}"))
            # A registration inherited from the process this one was forked from may have been
            # replaced since (the fork server ignores SIGINT, and its children put Python's
            # handler back): register() would then only change the file, not the handler
            faulthandler.unregister(signal.SIGINT)
            faulthandler.register(signal.SIGINT, file=_interrupt_file[0], all_threads=True,
                                  chain=True)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"mpviz.trace: pid {os.getpid()} cannot show its stacks to the hang watchdog "
              f"({exc})", file=sys.stderr)
        return
    if old[0] is not None:
        for fd_and_file in old:     # a forked child: those were the parent's ...
            if fd_and_file is not None and _still_ours(fd_and_file):
                os.close(fd_and_file[0])   # ... unless the program closed that number and
    else:                                  # reused it (os.closerange, then open: a daemon)
        os.register_at_fork(after_in_child=register_stacks)


def tracker_words(directory):
    """In the resource tracker: say its cleanup after mpviz's kill in mpviz's words.

    A program's resource tracker (spawn, forkserver: 3.14's default) outlives a program that
    mpviz kills -- it exits once no process holds its pipe -- and then unlinks the semaphores
    and shared memory that the killed processes never unregistered, warning "There appear to be
    2 leaked semaphore objects to clean up at shutdown: {'/mp-x1', '/mp-x2'}". The cleanup is
    right; the warning blames the program for mpviz's kill, in ids that mean nothing to it. So
    when DIRECTORY (the stacks folder) holds ``KILLED_MARK``, which the launcher writes before
    it kills, that warning goes to DIRECTORY/PID.tracker.txt as "2 semaphore", and the launcher
    says it. Any other warning, or this one without the mark (a leak of the program's own), is
    Python's as always."""
    import re
    import warnings
    leaked = re.compile(r"resource_tracker: There appear to be (\d+) leaked (\w+) objects")
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        found = leaked.match(str(message))
        if found and os.path.exists(os.path.join(directory, KILLED_MARK)):
            try:
                with open(os.path.join(directory, f"{os.getpid()}{TRACKER_SUFFIX}"), "a") as f:
                    f.write(f"{found[1]} {found[2]}\n")
                return
            except OSError:
                pass                       # (then Python's words, rather than none)
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


# faulthandler's first line, by the signal that crashed the process
_FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
          "Floating-point exception": "SIGFPE", "Illegal instruction": "SIGILL"}


def crash_report(directory, pid):
    """(signal name, faulthandler's report) of process `pid` if it crashed (see
    register_stacks: the report is written only as a process dies of one), else None."""
    try:
        with open(os.path.join(directory, f"{pid}{CRASH_SUFFIX}"), errors="replace") as f:
            text = f.read(64 * 1024)
    except OSError:
        return None
    first = text.split("\n", 1)[0]
    if not first.startswith("Fatal Python error: "):
        return None
    what = first[len("Fatal Python error: "):].strip()
    return _FATAL.get(what, what), text


def _open_own(path):
    """(fd, (device, inode)) of `path`, opened for writing: a plain fd (faulthandler takes
    one), and what it is, to know it again after a fork."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    st = os.fstat(fd)
    return fd, (st.st_dev, st.st_ino)


def _still_ours(fd_and_file):
    try:
        st = os.fstat(fd_and_file[0])
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == fd_and_file[1]


def _record_exit(directory, launcher):
    from .. import recorder
    if recorder.ENABLED:
        try:
            from .. import waits
            waits.thread_queues_left()     # (items a daemon thread will never get: lost work)
        except Exception:
            pass
        recorder.emit("process.exit", exitcode=None, how="atexit")
    if launcher and os.getppid() != launcher:     # re-parented: the launcher has gone
        print(f"mpviz trace: the launcher (pid {launcher}) is gone (killed?), so no trace.json "
              f"and no picture were written; the logs are in {directory}: "
              f"python -m mpviz trace --finish {directory} writes them", file=sys.stderr,
              flush=True)


def site_directory():
    """The directory to put on PYTHONPATH so that every Python process calls boot()."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
