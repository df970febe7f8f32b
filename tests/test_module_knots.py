"""Modules a student reads one at a time do not import each other back.

Each pair below was a knot once (A imported B, and B, lazily, A): reading either meant reading
both. The scan reads the source (every ``import``, at the top or inside a function) and fails
when the knot comes back, naming the line.
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (module, what it must never import): the arrow goes one way only
ONE_WAY = [
    ("mpviz.cuda.storage", "mpviz.cuda.ipc"),         # ipc makes storages; backends.of reads them
    ("mpviz.cuda.backends", "mpviz.cuda.ipc"),
    ("mpviz.cuda.backends", "mpviz.cuda.storage"),
    ("mpviz.trace.native", "mpviz.trace.recorder"),   # the recorder connects writer.c to itself
    ("mpviz._native", "mpviz.trace"),                 # the build helper knows nothing it builds
    ("mpviz._native", "mpviz.sharing"),
    ("mpviz.scenarios.cli", "mpviz.cli"),             # cli.py's table names scenarios/cli.py
]


def _path(module):
    base = os.path.join(ROOT, *module.split("."))
    return base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")


def imports_of(module):
    """Every module `module` imports, anywhere in it: [(imported module, line)]."""
    path = _path(module)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            if node.module:                       # (``from . import x``: x, not the package)
                found.append((base, node.lineno))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return found


@pytest.mark.parametrize("module, never", ONE_WAY, ids=[f"{a}-x-{b}" for a, b in ONE_WAY])
def test_the_arrow_goes_one_way(module, never):
    back = [(name, line) for name, line in imports_of(module)
            if name == never or name.startswith(never + ".")]
    assert not back, (f"{_path(module)} imports {never} again (lines "
                      f"{sorted({line for _, line in back})}): the two modules are knotted. "
                      f"Fix: move what both need into a module of its own")


def test_the_scan_sees_lazy_and_relative_imports():
    names = {name for name, _ in imports_of("mpviz.trace.recorder")}
    assert "mpviz.trace.native" in names          # lazily, inside writer_class
    assert "mpviz.cuda.backends" in {n for n, _ in imports_of("mpviz.cuda.storage")}
