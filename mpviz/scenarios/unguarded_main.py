"""unguarded-main: under spawn, a script's module-level statements run again in every child.

What happens: a spawned child is a fresh interpreter. To find the function it must run, it
imports the parent's main script again -- as a module named ``__mp_main__``, so that
``if __name__ == "__main__":`` is false there. Everything *outside* that guard runs again, in
every child: imports, prints, data loading... and, without a guard, the very line that starts
the children::

    python script.py               child (spawn): import script as __mp_main__
      print("module level")          print("module level")      ← runs again, in every child
      start children  ───────────▶   start children ✗  RuntimeError: "An attempt has been made
                                       to start a new process before the current process has
                                       finished its bootstrapping phase" (stdlib), exit code 1

mpviz refuses earlier and says why: ``MissingMainGuardError`` in the parent, before any child
starts. The fix: put the code that starts processes (and anything costly) under
``if __name__ == "__main__":``; keep module level to imports and definitions.
``guard=True`` runs the same script with the guard: it works, and the module-level mark still
appears once per child -- which is why it must stay cheap.
"""
import os

from .. import trace
from ._common import check_between, headline, run_program, step
from .base import Param

SUMMARY = "module-level statements run again in every spawned child"
PARAMS = {
    "guard": Param(False, [False, True], "put the process-starting code under "
                                         "if __name__ == '__main__':"),
    "library": Param("mpviz", ["mpviz", "stdlib"],
                     "mpviz refuses before starting (MissingMainGuardError); stdlib "
                     "multiprocessing lets each child crash"),
    "nprocs": Param(2, None, "children the script starts"),
}

SCRIPT = '''\
import json
import {module} as mp
from mpviz.scenarios.unguarded_main import announce, work

announce()                      # a module-level statement: runs in the parent AND every child


def main():
    ctx = mp.get_context("spawn")
    try:
        children = [ctx.Process(target=work, args=(i,)) for i in range({nprocs})]
        for p in children:
            p.start()
        for p in children:
            p.join()
        result = {{"exitcodes": [p.exitcode for p in children]}}
    except Exception as exc:
        if mp.current_process().name != "MainProcess":
            raise
        result = {{"error": type(exc).__name__, "message": str(exc)}}
    if mp.current_process().name == "MainProcess":
        print(json.dumps(result))


{call}
'''


def check_params(p):
    check_between(p, "nprocs", 1, 4)


def announce():
    import multiprocessing
    name = multiprocessing.current_process().name
    trace.mark("module-level code ran", process=name)


def work(i):
    step("child works", index=i)


def drive(p, details):
    folder = os.path.abspath("script")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.py")
    call = 'if __name__ == "__main__":\n    main()' if p["guard"] else "main()    # no guard!"
    module = "mpviz.multiprocessing" if p["library"] == "mpviz" else "multiprocessing"
    with open(path, "w") as f:
        f.write(SCRIPT.format(module=module, nprocs=p["nprocs"], call=call))
    details["script"] = open(path).read()
    step("run the script", path=path)
    details.update(run_program([path], "the script", cwd=folder))


def verdict(t, details):
    ran = [e.pid for e in t.of_kind("mark") if e.args.get("name") == "module-level code ran"]
    codes = details.get("exitcodes") or []
    times = f"{len(ran)} time(s)" + (f" (the parent and {len(ran) - 1} child(ren))" if len(ran) > 1
                                     else " (only in the parent)")
    if details.get("error"):
        return "error", (
            f"mpviz refused to start the children: {details['error']}: "
            f"{headline(details['message'])} The module-level statement ran {times}. "
            f"Fix: guard the code that starts processes with if __name__ == '__main__': "
            f"(guard=True).")
    if any(codes):
        return "error", (
            f"Each spawned child imported the script again and ran its module-level code (the "
            f"mark ran {times}), including the unguarded main() that starts processes; the stdlib "
            f"stopped each child with 'An attempt has been made to start a new process before "
            f"the current process has finished its bootstrapping phase' (exit codes {codes}; the "
            f"traceback is in the output). Fix: if __name__ == '__main__': main() (guard=True).")
    return "ok", (
        f"With the guard, the children ran their work and exited with {codes}. Note the "
        f"module-level statement still ran {times}: each spawned child imports the script "
        f"again, so keep module level cheap (imports and definitions only).")
