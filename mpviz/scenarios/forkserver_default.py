"""forkserver-default: a script that worked under fork breaks under Python 3.14's new default.

What happens: until Python 3.13, a Linux process started with ``mp.Process(...)`` or a ``Pool``
without naming a start method was *forked*: a copy of the parent, with every function and
global already in it. Python 3.14 made ``forkserver`` the default on Linux (pitfall #13): the
child is forked from a clean server process, so what it needs must travel by pickle or be
re-created by importing the main module. Two things a fork hid now break::

    def main():                                   under fork          under forkserver
        CONFIG["lr"] = 0.5                        child has it        child imports the script:
        def work(x, out): ...                                         CONFIG is {} again
        Process(target=work).start()              nothing pickled     ✗ Can't pickle local
        Process(target=scale).start()   # global  ✓                     object 'main.<locals>.work'
                                                                      ✗ KeyError: 'lr' in the child

The case writes such a script and runs it as a program. On Python before 3.14 the script's
``mp.set_start_method("forkserver")`` stands in for the new default (on 3.14 the line is
skipped: the default is already forkserver).

The fixes (``fix``): name the context explicitly, ``mp.get_context("fork")`` (the script then
behaves the same on every version -- with fork's own risks, see fork-held-lock); or make the code
fit every start method: a module-level function, with what it needs passed as arguments
(``spawn-safe``).
"""
import os

from ._common import headline, run_program, step
from .base import Param

SUMMARY = "a script relying on fork breaks under Python 3.14's default (forkserver)"
PARAMS = {
    "breaks_on": Param("local-function", ["local-function", "global-state"],
                       "what the script relies on: a function defined inside main(), or a "
                       "global that main() fills in"),
    "fix": Param("none", ["none", "explicit-context", "spawn-safe"],
                 "explicit-context: mp.get_context('fork'); spawn-safe: a module-level function "
                 "given what it needs as arguments; none: the default start method"),
    "library": Param("stdlib", ["stdlib", "mpviz"],
                     "stdlib multiprocessing (torch.multiprocessing is the same objects) or "
                     "mpviz.multiprocessing (which names an unpicklable target before starting; a "
                     "global left empty still fails in the child)"),
}
STALL_SECONDS = 6.0

SCRIPT = '''\
import json
import sys
import {module} as mp

CONFIG = {{}}                         # filled in by main()


def scale(x, out):                  # module-level, but reads the global CONFIG
    out.put(x * CONFIG["lr"])


def scale_with(x, lr, out):         # module-level, and given what it needs
    out.put(x * lr)


def main():
    CONFIG["lr"] = 0.5

    def work(x, out):               # a local function
        out.put(x * CONFIG["lr"])

    ctx = {context}
    out = ctx.Queue()
    result = {{"start_method": ctx.get_start_method(), "python": sys.version_info[:2]}}
    try:
        p = ctx.Process(target={target}, args={args})
        p.start()
        p.join(20)
        result["exitcode"] = p.exitcode
        if p.exitcode == 0:
            result["got"] = out.get(timeout=10)
    except Exception as exc:
        result["error"] = type(exc).__name__ + ": " + str(exc)
    print(json.dumps(result))


if __name__ == "__main__":
    if sys.version_info < (3, 14):
        mp.set_start_method("forkserver")     # stands in for Python 3.14's new default
    main()
'''


def script_text(p):
    """The script for parameters `p` (the notebook shows it)."""
    context = 'mp.get_context("fork")    # explicit' if p["fix"] == "explicit-context" else \
        "mp.get_context()          # the default"
    if p["fix"] == "spawn-safe":
        target, args = "scale_with", '(2, CONFIG["lr"], out)'
    else:
        target = "work" if p["breaks_on"] == "local-function" else "scale"
        args = "(2, out)"
    module = "mpviz.multiprocessing" if p["library"] == "mpviz" else "multiprocessing"
    return SCRIPT.format(module=module, context=context, target=target, args=args)


def drive(p, details):
    folder = os.path.abspath("script")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.py")
    with open(path, "w") as f:
        f.write(script_text(p))
    details["script"] = script_text(p)
    step("run the script", path=path)
    details.update(run_program([path], "the script", cwd=folder))


def verdict(t, details):
    prm = details["params"]
    method = details.get("start_method")
    python = tuple(details.get("python") or (0, 0))
    old = ("(Python 3.14's default" + (f"; on Python {python[0]}.{python[1]} here, the script's "
                                       f"set_start_method('forkserver') stands in for it)"
                                       if python < (3, 14) else ")"))
    if details.get("error"):
        return "error", (
            f"The script started its worker with the default start method, '{method}' {old}, "
            f"and start() failed in the parent: {headline(details['error']).rstrip('.')}. A "
            f"forkserver child gets its target by pickle, and a function defined inside main() "
            f"has no name a child could import; under fork nothing was pickled, so on Linux "
            f"this worked until 3.14. Fix: an explicit context, mp.get_context('fork') "
            f"(fix='explicit-context'), or a module-level function given what it needs "
            f"(fix='spawn-safe').")
    if details.get("exitcode"):
        return "error", (
            f"The worker started with the default start method, '{method}' {old}, and died "
            f"with exit code {details['exitcode']} (its traceback, KeyError: 'lr', is in the "
            f"output): it read CONFIG, which main() had filled in the parent; a forkserver "
            f"child imports the script afresh, where CONFIG is still empty. Under fork it was a "
            f"copy of the parent, so on Linux this worked until 3.14. Fix: an explicit context, "
            f"mp.get_context('fork') (fix='explicit-context'), or pass what the worker needs "
            f"as arguments (fix='spawn-safe').")
    copied = ("the function defined inside main() already exists" if
              prm["breaks_on"] == "local-function" else
              "main() had filled CONFIG in before the fork")
    how = {"explicit-context": f"the script names its context, 'fork', so it no longer depends "
                               f"on the version's default: the child is a copy of the parent, "
                               f"in which {copied}",
           "spawn-safe": f"the worker is a module-level function given lr as an argument, so it "
                         f"works under '{method}' (and any start method)",
           "none": f"the default start method was '{method}'"}[prm["fix"]]
    return "ok", f"The worker sent back {details.get('got')}: {how}."
