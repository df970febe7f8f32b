"""No function in mpviz/ is longer than a reader can hold, unless LONG says why.

A student follows the code one function at a time; a function of hundreds of lines (the
timeline was 394, the shm daemon's loop 269) is read as a wall, and the step they look for is
somewhere inside it. So the scan reads every ``def`` in mpviz/ (methods and nested functions
too, each counted from its ``def`` to its last line) and fails on one over MAX_LINES that LONG
does not name with a one-line reason. A function LONG names that is no longer over the limit
(or no longer there) fails too: remove it from the list, so the list stays true.
Cheap: the source is parsed, nothing is imported.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 80

_PENDING = "split pending (another change in flight)"

# "path:Qualified.name" -> why it is longer than MAX_LINES
LONG = {
    "mpviz/trace/analysis.py:_Index.__init__": _PENDING,
    "mpviz/trace/dist_verdict.py:Verdict.missing": _PENDING,
}


def _functions(path):
    """(qualified name, first line, number of lines) of every def in the file at `path`."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def _long_functions():
    """{"path:name": (lines, first line)} of every function in mpviz/ over MAX_LINES."""
    long = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "mpviz")):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            for qualname, line, n in _functions(path):
                if n > MAX_LINES:
                    long[f"{rel}:{qualname}"] = (n, line)
    return long


def test_no_function_in_mpviz_is_over_80_lines_unless_listed_with_its_reason():
    unlisted = {k: v for k, v in _long_functions().items() if k not in LONG}
    assert not unlisted, (
        "functions over {} lines: {}. Split each into named steps a reader can follow (one "
        "function per step, a one-line docstring each). Fix: split it, or, if it truly reads "
        "best whole, add it to LONG in tests/test_function_length.py with a one-line reason"
        .format(MAX_LINES, "; ".join(f"{k} ({n} lines, line {line})"
                                     for k, (n, line) in sorted(unlisted.items()))))


def test_every_function_listed_as_long_still_is():
    long = _long_functions()
    stale = sorted(k for k in LONG if k not in long)
    assert not stale, (
        f"listed in LONG but not over {MAX_LINES} lines (or gone): {stale}. Fix: remove them "
        f"from LONG in tests/test_function_length.py, so the list says only what is true")


def test_every_reason_is_one_line():
    bad = sorted(k for k, why in LONG.items() if not why.strip() or "\n" in why)
    assert not bad, f"LONG's reasons must be one line each: {bad}"
