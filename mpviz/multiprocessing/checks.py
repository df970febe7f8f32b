"""Catch, in the parent and before anything starts, the two mistakes that make spawn hang or crash.

1. **A function the child cannot find.** Under ``spawn`` and ``forkserver`` a function travels
   *by reference*: pickle writes "module ``m``, name ``f``" and the child imports ``m`` to find
   ``f``. That fails for a lambda or a function nested in another (they have no importable name),
   and for a function defined in a notebook cell or a REPL, whose ``__main__`` is not a file the
   child can import. The stdlib's ``Pool`` then *hangs*: its workers die unpickling the task
   (``AttributeError: Can't get attribute 'f' on <module '__main__' (built-in)>``, printed only on
   their stderr) and the pool keeps waiting for a result that never comes.

2. **Starting processes from unguarded module-level code.** A spawned child runs the parent's
   main script again, as a module, to find its functions. Every statement not under
   ``if __name__ == "__main__":`` runs again in every child — including the one that starts the
   children, which the stdlib then stops with "An attempt has been made to start a new process
   before the current process has finished its bootstrapping phase".

Under ``fork`` the child is a copy of the parent, so neither applies and nothing is checked.
"""
import ast
import functools
import os
import sys
import types


class UnpicklableFunctionError(TypeError):
    """Raised when a process or pool is given a function that its children could not import."""


class MissingMainGuardError(RuntimeError):
    """Raised when processes are started by module-level code of a script without a main guard."""


def check_function(fn, start_method, what="target"):
    """Raise UnpicklableFunctionError if a `start_method` child could not import `fn`."""
    if start_method == "fork" or fn is None:
        return
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not isinstance(fn, types.FunctionType):
        return  # builtins, bound methods of importable classes, callables: pickle decides
    name = getattr(fn, "__qualname__", fn.__name__)
    where = fn.__module__
    fix = ("Fix: move the function into a .py file (a module) and import it, e.g. create "
           "workers.py next to your notebook with `def f(x): ...`, then `from workers import f`; "
           "or use start method 'fork' (Linux only, and unsafe with threads).")
    if fn.__name__ == "<lambda>" or "<locals>" in name:
        kind = "a lambda" if fn.__name__ == "<lambda>" else f"the nested function {name}"
        raise UnpicklableFunctionError(
            f"the {what} is {kind}, which the '{start_method}' start method cannot send: a child "
            f"process finds functions by importing them by name, and this one has no importable "
            f"name. {fix}")
    if where == "__main__" and not _main_is_importable():
        raise UnpicklableFunctionError(
            f"the {what} {name}() is defined in __main__ of an interactive session (a notebook "
            f"cell or a REPL). Under '{start_method}' each child starts a fresh interpreter and "
            f"imports the function by name, but an interactive __main__ is not a file it can "
            f"import, so the child would die with \"Can't get attribute '{fn.__name__}' on "
            f"<module '__main__'>\" — and a Pool would wait for it forever. {fix}")


def _main_is_importable():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None:
        return True  # run with python -m: the child imports it by module name
    return bool(path) and os.path.exists(path) and not path.endswith(("ipykernel_launcher.py",))


def check_main_guard(start_method, stack_depth=3):
    """Raise MissingMainGuardError if module-level code of the main script is starting a child."""
    if start_method == "fork":
        return
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.exists(path):
        return
    frame = sys._getframe(stack_depth)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in ("__main__", "__mp_main__"):
            if frame.f_code.co_filename == path and not _line_is_guarded(path, frame.f_lineno):
                raise MissingMainGuardError(
                    f"{os.path.basename(path)}, line {frame.f_lineno}, starts a process from "
                    f"module-level code without a main guard. Under '{start_method}' each child "
                    f"imports {os.path.basename(path)} again to find its functions, so every "
                    f"unguarded statement runs again in every child — including this one. Fix:\n\n"
                    f"    if __name__ == '__main__':\n"
                    f"        ...  # create and start processes here\n")
            return
        frame = frame.f_back


@functools.lru_cache(maxsize=32)
def _guarded_lines(path, mtime):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return frozenset(lines)


def _line_is_guarded(path, lineno):
    try:
        return lineno in _guarded_lines(path, os.stat(path).st_mtime)
    except (OSError, SyntaxError, ValueError):
        return True  # can't tell: don't cry wolf


def _is_main_test(test):
    # `__name__ == "__main__"` in either order
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts)
