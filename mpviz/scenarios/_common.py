"""Small helpers the scenario modules share (in the driver process and in their workers).

* ``Details``: the dict a case writes what it observed into; saved to ``details.json`` in the
  trace directory at every change, so a run the watchdog had to kill still tells its story.
* ``context(p)``: the mpviz multiprocessing context for ``p["start_method"]``, with the sharing
  strategy of ``p["strategy"]`` (when the case has one) switched on for this driver.
* ``step(label, **args)``: a ``mark`` event -- a visible step on the timeline, and progress for
  the watchdog (a case that is busy but records nothing would look stuck).
* ``START_METHODS``, ``STRATEGIES``: the choices, for ``PARAMS``.
* ``check_between(p, name, lo, hi, note="")``: the range check a scenario's ``check_params``
  makes (`note` follows the bounds in the message: " seconds", " (16 MiB)").
* ``get_read_and_release(out, consumer, details)``: the driver's half of the cuda examples'
  consumer, after its first report.
"""
import json
import multiprocessing
import os

from .. import trace
from .base import Param

START_METHODS = multiprocessing.get_all_start_methods()
STRATEGIES = ["file_descriptor", "file_system"]


def start_method_param(default="fork", why=""):
    return Param(default, START_METHODS,
                 "how children start: fork (copy of the parent), spawn (fresh interpreter), "
                 "forkserver" + (f"; {why}" if why else ""))


def strategy_param(default="file_descriptor", why=""):
    return Param(default, STRATEGIES,
                 "how CPU tensors are shared: file_descriptor (fd passed by the live sender) or "
                 "file_system (a named /dev/shm segment)" + (f"; {why}" if why else ""))


def check_between(p, name, lo, hi, note=""):
    """ValueError naming parameter `name` unless ``lo <= p[name] <= hi`` (for ``check_params``)."""
    if not lo <= p[name] <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}{note}, got {p[name]}")


class Details(dict):
    """A dict saved as JSON to `path` after every change (values must be JSON-able)."""

    def __init__(self, path=None):
        super().__init__()
        self.path = path

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.save()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.save()

    def save(self):
        if self.path is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self, f, default=repr)
        os.replace(tmp, self.path)


def load_details(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def context(p):
    """The context for this case's start method; also applies its sharing strategy, if any."""
    import mpviz.multiprocessing as mp
    if "strategy" in p:
        mp.set_sharing_strategy(p["strategy"])
    return mp.get_context(p.get("start_method") or mp.get_start_method())


def step(label, **args):
    """Record a visible step (a ``mark`` event): progress for the watchdog, a label for people."""
    trace.mark(label, **args)


def get(q, timeout=20, what="a message", sender=None):
    """``q.get`` with a bound, saying what was expected if it never came.

    `sender`: the Process expected to put it; if it exits without doing so, fail at once
    (RuntimeError with its exit code) instead of waiting out the timeout.
    """
    import queue
    import time
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.2 if sender is not None else timeout)
        except queue.Empty:
            if sender is not None and sender.exitcode is not None:
                try:
                    return q.get(timeout=0.5)      # it may have put it just before exiting
                except queue.Empty:
                    raise RuntimeError(f"{what} never came: {sender.name} exited with code "
                                       f"{sender.exitcode} (its traceback is in the output)")
            if sender is None or time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout} s") from None


def get_read_and_release(out, consumer, details):
    """The last two reports of ``cuda.examples.consumer`` -- ``("read", valid, sum)`` and
    ``("released", received)`` -- from its `out` queue into ``details["read"]`` and
    ``details["released"]``."""
    details["read"] = get(out, what="the consumer's read", sender=consumer)
    details["released"] = get(out, what="the consumer's release", sender=consumer)


def kib(n):
    return f"{n / 1024:,.0f} KiB" if n < 1 << 20 else f"{n / (1 << 20):,.1f} MiB"


def run_program(args, what, timeout=25, cwd=None):
    """Run a separate Python program, *recorded* into this run's trace, and return its last line
    of standard output parsed as JSON (its standard error goes to the run's output).

    For the cases whose lesson needs a ``__main__`` of its own (a script without a main guard,
    a ``python -c`` program standing for a notebook): it records through mpviz's autostart, as
    ``python -m mpviz trace`` would.
    """
    import subprocess
    import sys
    from ..trace import autostart, recorder
    env = dict(os.environ)
    env[autostart.ENV_DIR] = recorder.current_directory()
    env["PYTHONPATH"] = os.pathsep.join(
        [autostart.site_directory()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run([sys.executable] + list(args), env=env, stdout=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True, timeout=timeout, cwd=cwd)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{what} printed no result (exit status {done.returncode}); "
                           f"its output was: {done.stdout[-1000:]!r}")
    return dict(json.loads(lines[-1]), returncode=done.returncode)


def headline(error_text):
    """The first sentence of an error message (mpviz's say what, then why, then how to fix:
    an explanation quotes the *what* and gives its own why and fix)."""
    text = " ".join(str(error_text).split())
    end = text.find(". ", 20)
    return text if end < 0 else text[:end + 1]
