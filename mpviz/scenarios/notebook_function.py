"""notebook-function: a spawn Pool given a function defined in ``__main__`` of a notebook.

What happens: under ``spawn`` (and ``forkserver``, the default from Python 3.14) a function
travels *by name*: pickle writes "``__main__.square``", and the worker, a fresh interpreter,
looks the name up in *its* ``__main__``. In a script that works (the worker re-imports the
script). In a notebook or REPL, ``__main__`` is not a file -- the worker's ``__main__`` has no
``square``. With the stdlib each worker dies unpickling its task (``AttributeError: Can't get
attribute 'square' on <module '__main__' (built-in)>``, printed only on the workers' stderr),
the Pool replaces it with a new worker, and ``map`` waits forever for results that will never
come::

    kernel (__main__.square)    pool.map(square, ...) ... waits forever
    worker 1 (spawn)            get task → unpickle "__main__.square" ✗ AttributeError → dies
    worker 3 (replacement)      idle: the task died with worker 1

Here the notebook is played by a ``python -c`` program (its ``__main__`` is not a file either).
mpviz's Pool checks before sending and raises ``UnpicklableFunctionError``, which says why and
what to do. The fix: put the function in a module (a .py file next to the notebook) and import
it -- as ``square`` below lives in this module (``function="module"``).
"""
from ._common import run_program, step
from .base import Param

SUMMARY = ("a spawn Pool given a function defined in __main__: workers die, the parent would "
           "hang; mpviz says why")
PARAMS = {
    "function": Param("notebook", ["notebook", "module"],
                      "where square() is defined: in the notebook's __main__, or in a module"),
    "library": Param("mpviz", ["mpviz", "stdlib"],
                     "mpviz refuses with UnpicklableFunctionError; stdlib multiprocessing hangs"),
}
STALL_SECONDS = 3.0

PROGRAM = '''\
import json
import {module} as mp
{definition}
try:
    with mp.get_context("spawn").Pool(2) as pool:
        print(json.dumps({{"result": pool.map(square, range(4), chunksize=1)}}), flush=True)
except Exception as exc:
    print(json.dumps({{"error": type(exc).__name__, "message": str(exc)}}), flush=True)
'''

IN_MAIN = '''
def square(x):          # defined "in the notebook": lives in __main__
    return x * x
'''
IN_MODULE = "from mpviz.scenarios.notebook_function import square   # lives in a module"


def square(x):
    return x * x


def drive(p, details):
    module = "mpviz.multiprocessing" if p["library"] == "mpviz" else "multiprocessing"
    program = PROGRAM.format(module=module,
                             definition=IN_MAIN if p["function"] == "notebook" else IN_MODULE)
    details["program"] = program
    step("run the notebook-like program (python -c: its __main__ is not a file)")
    details.update(run_program(["-c", program], "the notebook program"))


def verdict(t, details):
    prm = details["params"]
    workers = [p for p in t.processes() if p.how == "spawn"]
    died = [p for p in workers if p.exitcode not in (None, 0)]
    if "stuck" in details:
        return "deadlock", (
            f"The stdlib Pool sent square() by name, '__main__.square'. Each spawn worker "
            f"(a fresh interpreter whose __main__ is not the notebook's) failed to find it while "
            f"unpickling its task and died ({len(died) or 'several'} worker lanes end early with "
            f"exit code 1; the AttributeError is only on their stderr). The pool started "
            f"replacements, but the tasks died with the workers, so map() waited forever until "
            f"the watchdog stopped it. Fix: define the function in a module and import it "
            f"(function='module'); mpviz's Pool (library='mpviz') refuses up front instead.")
    if details.get("error"):
        return "error", (
            f"mpviz checked the function before sending it and refused: {details['error']}: "
            f"{details['message']} No worker was given a task it could not run, so nothing "
            f"hung. Fix: function='module'.")
    if details.get("result") == [0, 1, 4, 9]:
        return "ok", ("square() lives in a module, so each spawn worker imported it by name and "
                      f"pool.map returned {details['result']} (library={prm['library']}).")
    return "error", f"Unexpected end: {details}"
