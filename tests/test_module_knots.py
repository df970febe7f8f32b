"""Modules a student reads one at a time do not import each other back.

Each pair in ONE_WAY was a knot once (A imported B, and B, lazily, A): reading either meant
reading both. The scan reads the source (every ``import``, at the top or inside a function) and
fails when the knot comes back, naming the line. Beyond those pairs: no module of mpviz is in a
cycle of top-level imports (the imports that run when the module is imported) unless
ALLOWED_CYCLES names the cycle with its reason, and every module imports alone in a fresh
interpreter (a cycle that works only when entered from one side fails there). An import inside a
function that closes a cycle is named in LAZY_BACK_EDGES with its one-line reason.
"""
import ast
import os
import subprocess
import sys
import textwrap

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


def _top_level(body):
    """The statements that run when the module is imported: not those inside a def or class."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):   # if/try/with at the top
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _top_level(inner)


def imports_of(module, top_level_only=False):
    """Every module `module` imports, anywhere in it (or only at its top level): [(imported
    module, line)]."""
    path = _path(module)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in (_top_level(tree.body) if top_level_only else ast.walk(tree)):
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


# --- no cycle of top-level imports -----------------------------------------------------------

# {the modules of a cycle: why it stays}. A cycle not named here fails the test, and so does a
# name here that is no longer a cycle (the list cannot go stale).
ALLOWED_CYCLES = {
}


def all_modules():
    """Every module of the mpviz package, by its dotted name."""
    names = []
    for folder, _, files in os.walk(os.path.join(ROOT, "mpviz")):
        for name in files:
            if name.endswith(".py"):
                dotted = os.path.relpath(os.path.join(folder, name[:-3]), ROOT).replace(os.sep, ".")
                names.append(dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted)
    return sorted(names)


def top_level_graph(modules):
    """module -> the mpviz modules its top-level imports run. Importing ``a.b.c`` runs the
    packages ``a`` and ``a.b`` too; the importer's own packages are left out (Python imports them
    before it, so they are never waiting on it)."""
    known = set(modules)
    graph = {}
    for module in modules:
        edges = set()
        for name, _ in imports_of(module, top_level_only=True):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if target in known and not (module == target or module.startswith(target + ".")):
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan): each a frozenset."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_top_level_scan_skips_what_runs_later():
    top = {n for n, _ in imports_of("mpviz.trace.recorder", top_level_only=True)}
    assert "mpviz.trace.native" not in top            # inside writer_class: runs when called
    assert "mpviz.trace.native" in {n for n, _ in imports_of("mpviz.trace.recorder")}


def test_no_cycle_of_top_level_imports_but_the_allowed():
    graph = top_level_graph(all_modules())
    found = set(cycles(graph))
    new = [sorted(c) for c in found - set(ALLOWED_CYCLES)]
    assert not new, (f"top-level imports go round in a cycle: {new} "
                     f"({[(a, sorted(graph[a] & set(c))) for c in new for a in c]}). Importing one "
                     f"of them runs the others before it is complete. Fix: move what both need "
                     f"into a module of its own, or import lazily inside the function that "
                     f"needs it (and say why in a line)")
    stale = [sorted(c) for c in set(ALLOWED_CYCLES) - found]
    assert not stale, f"ALLOWED_CYCLES names cycles that are gone: {stale}. Fix: remove them"


def test_every_module_imports_alone_in_a_fresh_interpreter():
    # One Python that has imported nothing of mpviz forks a child per module; each child imports
    # its module first of all, as a script or a spawned child would. Four children at a time:
    # each is independent of the others, and most of their time is spent importing (matplotlib
    # alone is 1-2 s on a loaded machine for each of the ten modules that draw).
    script = textwrap.dedent("""
        import importlib, os, sys
        import numpy                      # (not ours: imported once, for speed)
        failed, running, todo = [], {}, list(sys.argv[1:])
        while todo or running:
            while todo and len(running) < 4:
                name = todo.pop(0)
                pid = os.fork()
                if pid == 0:
                    try:
                        importlib.import_module(name)
                    except BaseException as exc:
                        os.write(2, f"{name}: {type(exc).__name__}: {exc}\\n".encode())
                        os._exit(1)
                    os._exit(0)
                running[pid] = name
            pid, status = os.wait()
            if status != 0:
                failed.append(running[pid])
            del running[pid]
        print(sorted(failed))
        """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, "-c", script, *all_modules()], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=110)
    assert result.returncode == 0 and result.stdout.strip() == "[]", (
        f"modules that do not import alone: {result.stdout.strip()}\n{result.stderr[-3000:]}")


# --- lazy imports that close a cycle ----------------------------------------------------------

# {(importer, imported): why the import waits inside a function}. Each of these imports a module
# that itself imports the importer at its top, so at the importer's top it would be a cycle.
LAZY_BACK_EDGES = {
    ("mpviz.storage", "mpviz.multiprocessing.reductions"):
        "reductions builds on storage; a storage pickled by the stdlib asks it for its handle",
    ("mpviz.tensor", "mpviz.autograd"): "autograd builds Tensors itself",
    ("mpviz.tensor", "mpviz.multiprocessing.reductions"):
        "reductions rebuilds Tensors; a Tensor subclass registers its reducer when defined",
    ("mpviz.tensor", "mpviz.cuda"): "cuda wraps Tensors; only a device other than cpu needs it",
    ("mpviz.trace.messages", "mpviz.trace.hooks"):
        "hooks installs messages' wrappers; messages borrows hooks' _patch for mpviz's Queue",
    ("mpviz.trace.trace", "mpviz.viz"): "viz's timeline draws a Trace; Trace.plot is the way back",
    ("mpviz.trace.trace", "mpviz.trace.watchdog"):
        "the watchdog reads Traces; record(hang_after=...) starts it only when asked",
}


def lazy_back_edges():
    """{(importer, imported): first line} for each import inside a function whose module runs the
    importer again through top-level imports."""
    modules = all_modules()
    graph = top_level_graph(modules)
    known = set(modules)

    def reaches(start, goal):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    found = {}
    for module in modules:
        at_top = {name for name, _ in imports_of(module, top_level_only=True)}
        for name, line in imports_of(module):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                target = ".".join(parts[:i])
                if (name not in at_top and target in known and target != module
                        and not module.startswith(target + ".") and reaches(target, module)):
                    found.setdefault((module, target), line)
                    break
    return found


def test_every_lazy_import_that_closes_a_cycle_says_why():
    found = lazy_back_edges()
    unlisted = {pair: line for pair, line in found.items() if pair not in LAZY_BACK_EDGES}
    assert not unlisted, (f"lazy imports that close a cycle, with no reason given: {unlisted} "
                          f"((importer, imported): line). Fix: add each to LAZY_BACK_EDGES with "
                          f"one line of why, or move what both need into a module of its own")
    stale = [pair for pair in LAZY_BACK_EDGES if pair not in found]
    assert not stale, f"LAZY_BACK_EDGES names lazy imports that are gone: {stale}. Fix: remove them"
