"""Helpers for notebook 10 (your own program): trace a script from a notebook, and check answers.

The learner's programs are plain scripts in ``notebooks/programs/`` that know nothing of mpviz.
The notebook runs each one as a learner would from a shell, through the CLI::

    python -m mpviz trace --hang-after 2 --no-plot -o DIR -- python notebooks/programs/X.py

in a subprocess (so the kernel forks nothing), then reads DIR back with ``mpviz.trace.load``
and draws it inline. ``--no-plot``: the notebook draws, the launcher need not (~1.5 s saved).

    run = trace_program("hang_join.py")        run it traced; run.status, run.messages, run.trace
    run.show()                                 what the program and the launcher printed
    check_no_hang(run)                         exercise check: exit status 0, no verdict?
    check_handovers(run, guess)                exercise check: how many fds did torch hand over?
    need_torch()                               True if torch is installed, else says how to get it
"""
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass

from .. import _tempdirs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = os.path.join(ROOT, "notebooks", "programs")
HANG_STATUS = 124          # the launcher's exit status after a hang verdict (as `timeout`'s)

__all__ = ["trace_program", "TracedRun", "check_no_hang", "check_handovers", "need_torch",
           "PROGRAMS"]


@dataclass
class TracedRun:
    """One traced run: the command, its exit status, what it printed, and the trace."""
    command: list
    status: int
    output: str          # the program's stdout
    messages: str        # stderr: the launcher's lines (the verdict among them), the program's
    directory: str
    trace: object        # mpviz.trace.Trace, read back from `directory`

    @property
    def hung(self):
        return "HANG:" in self.messages

    def show(self):
        shown = ["python" if a == sys.executable else a for a in self.command]
        print("$", " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a
                            for a in shown))
        if self.output:
            print(self.output.rstrip())
        print(self.messages.rstrip())
        print(f"exit status: {self.status}")


def trace_program(script, *args, hang_after=2, directory=None, timeout=60, wrap=()):
    """Run ``notebooks/programs/<script>`` with `args` under ``python -m mpviz trace``.

    `hang_after`: the watchdog's seconds (0: off). `directory`: where the trace goes (default: a
    new temporary folder). `timeout`: a guard for the notebook itself, far above any run here.
    `wrap`: a command that runs the rest (e.g. ``unshare ...``), as ``wrap + [python -m ...]``.
    Returns a ``TracedRun``."""
    path = os.path.join(PROGRAMS, script)
    if not os.path.isfile(path):
        raise ValueError(f"no program {script!r} in {PROGRAMS}. Fix: one of "
                         f"{', '.join(sorted(f for f in os.listdir(PROGRAMS) if f.endswith('.py')))}")
    directory = directory or _tempdirs.make(f"mpviz-{script[:-3]}-")   # removed at exit
    command = [*wrap, sys.executable, "-m", "mpviz", "trace", "--hang-after", str(hang_after),
               "--no-plot", "-o", directory, "--", sys.executable, path, *map(str, args)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)
    from mpviz.trace import load
    return TracedRun(command, done.returncode, done.stdout, done.stderr, directory,
                     load(directory))


def need_torch():
    """True if torch can be imported here; else print why the torch cells do nothing, and the fix.
    (``./run workshop`` does not install torch, a download of several hundred MB; ``./run test``
    does.)"""
    if importlib.util.find_spec("torch") is not None:
        return True
    print("torch is not installed in this environment, so this cell traces nothing. Fix: "
          "install torch 2.13.0, the version mpviz's hooks were tested with (./run test "
          "installs it into .venv: the extra 'torch' of pyproject.toml), then restart the "
          "kernel.")
    return False


def check_no_hang(run):
    """Exercise check: did this traced run end by itself, with exit status 0?"""
    if run.hung:
        print(f"Still hangs: the watchdog gave a verdict (exit status {run.status}). Read its "
              f"stacks: the line of yours it names is where the program waits.")
    elif run.status != 0:
        print(f"No hang, but the program failed: exit status {run.status}.")
    else:
        print("Fixed: the program ended by itself with exit status 0, and the watchdog had "
              "nothing to say.")
    return run.status == 0 and not run.hung


def check_handovers(run, guess):
    """Exercise check: how many file descriptors did the program hand over (fd.send events)?"""
    if isinstance(guess, bool) or not isinstance(guess, int):
        raise TypeError(f"give the number of descriptors as an int, not {guess!r}")
    sent = [e for e in run.trace.events if e.kind == "fd.send"]
    strategy = next((e.args.get("strategy") for e in run.trace.events
                     if e.kind == "shm.create"), "?")
    right = guess == len(sent)
    print(("Right" if right else "Not quite") + f": under {strategy} the trace has "
          f"{len(sent)} fd.send event(s); you said {guess}.")
    if strategy == "file_system":
        print("file_system names each segment in /dev/shm: the consumer opens it by its name, "
              "so no descriptor travels.")
    else:
        print("file_descriptor's segments have no name: the consumer asks the producer for "
              "the descriptor, one per tensor, over a Unix socket.")
    return right
