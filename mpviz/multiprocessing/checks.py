"""Catch, in the parent and before anything starts, the two mistakes that make spawn hang or crash.

1. **A function the child cannot find.** Under ``spawn`` and ``forkserver`` a function travels
   *by reference*: pickle writes "module ``m``, name ``f``" and the child imports ``m`` to find
   ``f``. That fails for a lambda or a function nested in another (they have no importable name),
   and for a function of ``__main__`` that the child's ``__main__`` will not have: one defined in
   a notebook cell, a REPL or ``python -c``, in a package's ``__main__.py``, or under the script's
   main guard. The stdlib's ``Pool`` then *hangs*: its workers die unpickling the task
   (``AttributeError: Can't get attribute 'f' on <module '__main__' (built-in)>``, printed only on
   their stderr) and the pool keeps waiting for a result that never comes; a ``Process`` dies
   with that error on arrival.

2. **Starting processes from unguarded module-level code.** A spawned child runs the parent's
   main script again, as a module named ``__mp_main__``, to find its functions. Every statement
   not under ``if __name__ == "__main__":`` runs again in every child — including the one that
   starts the children, which the stdlib then stops with "An attempt has been made to start a new
   process before the current process has finished its bootstrapping phase". Not every ``__main__``
   is run again: ``main_rerun_path`` below follows the stdlib's rules exactly, so that this check
   refuses what would fail and nothing else (``python -m unittest`` and ``python -m pkg`` run).

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
    fix = ("Fix: move the function into a .py file (a module) and import it, e.g. create "
           "workers.py next to your notebook with `def f(x): ...`, then `from workers import f`; "
           "or use start method 'fork' (Linux only, and unsafe with threads).")
    if fn.__name__ == "<lambda>" or "<locals>" in name:
        kind = "a lambda" if fn.__name__ == "<lambda>" else f"the nested function {name}"
        raise UnpicklableFunctionError(
            f"the {what} is {kind}, which the '{start_method}' start method cannot send: a child "
            f"process finds functions by importing them by name, and this one has no importable "
            f"name. {fix}")
    if fn.__module__ == "__main__":
        why = _why_main_function_is_missing(fn)
        if why.startswith("under its"):
            fix = (f"Fix: define {fn.__name__}() at module level, above the "
                   f"`if __name__ == '__main__':` line, or in a module you import.")
        if why:
            raise UnpicklableFunctionError(
                f"the {what} {name}() is defined in __main__ {why}. Under '{start_method}' each "
                f"child starts a fresh interpreter and looks the function up by name in its own "
                f"__main__, so it would die with \"Can't get attribute '{fn.__name__}' on "
                f"<module '__main__'>\" — and a Pool would wait for it forever. {fix}")


# --- when does a spawned child run the main module again? --------------------------------
#
# spawn (and forkserver, whose children are prepared the same way) tells each child how to
# rebuild the parent's __main__ (CPython's multiprocessing/spawn.py):
#
#   parent's __main__                        the child                 (spawn.py)
#   ---------------------------------------  ------------------------  --------------------------
#   has __spec__, name "m" (python -m m)     runs module m again,      get_preparation_data,
#                                            as __mp_main__            _fixup_main_from_name
#   ... name "__main__" or "pkg.__main__"    nothing: such a __main__  _fixup_main_from_name
#     (python -m pkg, a directory, a zip)    runs its code regardless
#   no __spec__, a __file__ (python f.py)    runs f.py again, as       _fixup_main_from_path
#                                            __mp_main__ (but not a file named ipython)
#   neither (python -c, a REPL, a notebook)  nothing
#
# What the child runs again must have its main guard; what it does not run again cannot hold
# the functions it is sent.

def main_rerun_path():
    """The file each spawn/forkserver child runs again as ``__mp_main__``, or None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None:
        if spec_name == "__main__" or spec_name.endswith(".__main__"):
            return None
        return path
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return path if os.path.exists(path) else None   # '<stdin>': the child cannot run it


def _why_main_function_is_missing(fn):
    """Why a child's __main__ will lack `fn` (a function of the parent's __main__), or ''."""
    path = main_rerun_path()
    main = sys.modules.get("__main__")
    if path is None:
        spec_name = getattr(getattr(main, "__spec__", None), "name", None)
        if spec_name is not None:
            return (f"run as {spec_name!r} (python -m of a package, or a directory or a zip file "
                    f"run as a script), which a spawned child never runs again")
        if sys.argv[:1] == ["-c"]:
            return "of `python -c` code, which is not a file a spawned child can run again"
        return ("of an interactive session (a notebook cell or a REPL), which is not a file a "
                "spawned child can run again")
    if fn.__code__.co_filename != path:
        return (f"by code that is not in {os.path.basename(path)} (a notebook cell, a REPL, "
                f"exec()), which a spawned child does not run again")
    if _guarded(path, fn.__code__.co_firstlineno):
        return (f"under its `if __name__ == '__main__':` guard ({os.path.basename(path)}, line "
                f"{fn.__code__.co_firstlineno}): a child runs the script again with __name__ set "
                f"to '__mp_main__', so the guarded block, and this definition, never run there")
    return ""


def check_main_guard(start_method, stack_depth=3):
    """Raise MissingMainGuardError if module-level code of the main script is starting a child."""
    if start_method == "fork":
        return
    path = main_rerun_path()
    if not path or not os.path.exists(path):
        return
    frame = sys._getframe(stack_depth)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in ("__main__", "__mp_main__"):
            if frame.f_code.co_filename == path and _guarded(path, frame.f_lineno) is False:
                raise MissingMainGuardError(
                    f"{os.path.basename(path)}, line {frame.f_lineno}, starts a process from "
                    f"module-level code without a main guard. Under '{start_method}' each child "
                    f"runs {os.path.basename(path)} again to find its functions, so every "
                    f"unguarded statement runs again in every child — including this one. (The "
                    f"stdlib finds out later, in the first child, and raises RuntimeError there: "
                    f"\"An attempt has been made to start a new process before the current "
                    f"process has finished its bootstrapping phase.\") Fix:\n\n"
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
                first = min([child.lineno] + [d.lineno for d in getattr(child, "decorator_list", [])])
                lines.update(range(first, (child.end_lineno or child.lineno) + 1))
    return frozenset(lines)


def _guarded(path, lineno):
    """True if line `lineno` of `path` is under a main guard, False if not, None: can't tell."""
    try:
        return lineno in _guarded_lines(path, os.stat(path).st_mtime)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None  # not Python source we can read (a .pyc, ...): don't cry wolf


def _is_main_test(test):
    # `__name__ == "__main__"` in either order
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and consts)


def check_args(args, param, example):
    """Raise TypeError unless `args` is an iterable of positional arguments (not a str or dict).

    The stdlib calls ``f(*args)`` in the child, or ``tuple(args)`` first: ``args=5`` then fails
    there, far from the mistake, and ``args="ab"`` passes two arguments, 'a' and 'b'.
    """
    if isinstance(args, (tuple, list)):
        return
    if (hasattr(args, "__iter__") and not isinstance(args, (str, bytes, dict))):
        return   # any other iterable is what the stdlib accepts too (it calls tuple(args))
    if isinstance(args, (str, bytes)):
        raise TypeError(
            f"{param} is the {type(args).__name__} {args!r}, not a tuple: it would be taken apart "
            f"into {len(args)} separate arguments, one per character. Fix: a one-element tuple "
            f"needs a trailing comma, ({args!r},); e.g. {example}.")
    raise TypeError(
        f"{param} must be a tuple of the function's positional arguments, not "
        f"{type(args).__name__} {args!r}. Fix: {param}=({args!r},) — (x) is just x in "
        f"parentheses, a one-element tuple needs the comma; e.g. {example}.")
