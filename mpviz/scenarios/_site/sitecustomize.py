"""Put on PYTHONPATH by a scenario run: every Python process of the run can show its stacks.

The watchdog (``mpviz/scenarios/runner.py``) needs the Python stacks of processes that are stuck,
and a stuck process cannot be asked politely. ``faulthandler`` can do it from a signal handler
written in C, which runs even while the main thread is blocked in a lock: on SIGUSR1 it writes
every thread's stack to a file. This file registers that in each process when
``MPVIZ_SCENARIO_STACKS`` names a directory: the stacks of process PID go to ``DIR/PID.txt``
(a forked child re-registers with its own file). Then it runs the ``sitecustomize`` it shadows,
if any (mpviz's recorder puts one on the path too, for ``python -m mpviz trace``).
"""
import os
import sys


def _register():
    import faulthandler
    import signal
    global _stacks
    directory = os.environ.get("MPVIZ_SCENARIO_STACKS")
    if not directory or not os.path.isdir(directory):
        return
    old = globals().get("_stacks")
    fd = os.open(os.path.join(directory, f"{os.getpid()}.txt"),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True)
    st = os.fstat(fd)
    _stacks = (fd, (st.st_dev, st.st_ino))
    if old is not None:
        # A forked child: that one was the parent's. Closed only if its number still names that
        # file: the program may have closed it (os.closerange) and opened one of its own there.
        try:
            st = os.fstat(old[0])
        except OSError:
            return
        if (st.st_dev, st.st_ino) == old[1]:
            os.close(old[0])


def _run_shadowed():
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.abspath(p or ".") for p in sys.path]
    after = sys.path[paths.index(here) + 1:] if here in paths else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if not getattr(sys, "_mpviz_scenario_site", False):   # once per process, however it is reached
    sys._mpviz_scenario_site = True
    try:
        _register()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_register)
    except Exception as exc:  # never stop a program because stack capture could not be set up
        print(f"mpviz.scenarios: cannot capture stacks in pid {os.getpid()}: {exc!r}",
              file=sys.stderr)
    _run_shadowed()
