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
    ("mpviz._speedups", "mpviz.trace"),               # the build helper knows nothing it builds
    ("mpviz._speedups", "mpviz.sharing"),
    ("mpviz.scenarios.cli", "mpviz.cli"),             # cli.py's table names scenarios/cli.py
    ("mpviz._proc", "mpviz"),                         # a leaf: the shm daemon loads it alone
    ("mpviz.trace.watchdog", "mpviz.scenarios.runner._stat"),   # /proc is read through _proc
    ("mpviz.tensor", "mpviz.multiprocessing"),        # reducers: registered by reductions alone
    ("mpviz.cuda", "mpviz.multiprocessing"),
    ("mpviz.autograd", "mpviz.multiprocessing"),
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



# --- the recorder is the bottom layer ----------------------------------------------------------

# trace/ records a run and reads it back; viz/ draws Traces, scenarios/ and stepper/ run
# programs: they import the recorder, never the other way. The stepper fills a slot instead
# (mpviz/_stops.py, autostart.ON_BOOT); pictures are imported by name (trace.trace.DRAWING), the
# one import up, named in UP_BY_NAME.
ABOVE_THE_RECORDER = ("mpviz.viz", "mpviz.scenarios", "mpviz.stepper")


def _above(name):
    return any(name == top or name.startswith(top + ".") for top in ABOVE_THE_RECORDER)


# {(recorder module, the module above it that it imports by a name in a string): why}. An
# import by name is still an import: the scan reads __import__("...") and
# importlib.import_module(X), X a string or a module-level name bound to one, as it reads an
# import statement, so no import up hides in a string unless this table names it.
UP_BY_NAME = {
    ("mpviz.trace.trace", "mpviz.viz"):
        "Trace.plot() and `mpviz trace`'s pictures (DRAWING): only when a picture is asked",
}


def imports_by_name(module):
    """[(module name, line)] of every __import__("...") and importlib.import_module(X) in
    `module`, X a string constant or a module-level name bound to one."""
    with open(_path(module)) as f:
        tree = ast.parse(f.read())
    constants = {target.id: node.value.value for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and call.args):
            continue
        func = call.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in ("__import__", "import_module"):
            continue
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append((arg.value, call.lineno))
        elif isinstance(arg, ast.Name) and arg.id in constants:
            found.append((constants[arg.id], call.lineno))
    return found


def test_the_scan_sees_an_import_by_name():
    names = {n for n, _ in imports_by_name("mpviz.trace.trace")}
    assert "mpviz.viz" in names                   # importlib.import_module(DRAWING)
    assert "mpviz.trace.hooks" not in names       # (an import statement: imports_of's)


def test_no_module_of_the_recorder_imports_viz_scenarios_or_the_stepper():
    recorder_modules = [m for m in all_modules()
                        if m == "mpviz.trace" or m.startswith("mpviz.trace.")]
    assert "mpviz.trace.watchdog" in recorder_modules and "mpviz.trace.autostart" in recorder_modules
    up = []
    for module in recorder_modules:
        up += [(module, name, line) for name, line in imports_of(module) if _above(name)]
        up += [(module, name, line) for name, line in imports_by_name(module)   # __import__(...)
               if _above(name) and (module, name) not in UP_BY_NAME]
    assert not up, (f"the recorder imports a layer above it (module, imported, line): {up}, at the "
                    f"top or inside a function. Fix: move what it needs down into trace/ (as "
                    f"analysis.py and session.py were), or give the upper layer a slot to fill "
                    f"(as mpviz/_stops.py is for the stepper)")


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
    ("mpviz.viz.collectives", "mpviz.viz.timeline"):
        "timeline draws collectives on its lanes; they borrow its box helpers when drawn",
    ("mpviz.storage", "mpviz.multiprocessing.reductions"):
        "reductions registers every reducer (init_reductions) and builds on storage: a Storage or "
        "Tensor pickled by the stdlib before it is loaded loads it (reduce_on_first_send)",
    ("mpviz.tensor", "mpviz.autograd"): "autograd builds Tensors itself",
    ("mpviz.tensor", "mpviz.cuda"): "cuda wraps Tensors; only a device other than cpu needs it",
    ("mpviz.trace.trace", "mpviz.trace.merge"):
        "merge builds MergedTrace on Trace and load; load() of a list of folders is the way in",
    ("mpviz.trace.trace", "mpviz.trace.watchdog"):
        "the watchdog reads Traces; record(hang_after=...) starts it only when asked",
    ("mpviz.trace.trace", "mpviz.trace.analysis"):
        "analysis reads Traces; record()'s end asks it for lost work once the block ended well",
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


# --- every import made inside a function ------------------------------------------------------

# Why each import of a module of mpviz waits inside a function (beyond LAZY_BACK_EDGES, which
# close cycles). Each one is a place a reader jumps to mid-function: the list keeps them counted
# and explained, and fails on a new one without a reason or an old one that is gone.
_PROGRAM = "a program students read and run: it imports in the process that runs it"
_CHECKER = "an exercise's check: loads what it checks when the learner runs that cell"
_DRIVEN = "scenario modules load for the catalog; mpviz.multiprocessing only in the run's driver"
_RECORDER_ONLY = "the recorder's own children: loaded in the run's driver, not in the catalog"
LAZY_IMPORTS = {
    ("mpviz", "mpviz.stepper.control"): "`import mpviz` stays cheap: the stepper loads at step()",
    ("mpviz.cli", "mpviz.sharing.file_system"): "only `mpviz shm` reads /dev/shm's names",
    ("mpviz.cli", "mpviz.sharing.shm_manager"): "only `mpviz shm` asks the manager",
    ("mpviz.cli", "mpviz.trace.launcher"): "only `mpviz trace` launches a program",
    ("mpviz.trace.launcher", "mpviz._speedups"): "builds json_events.c only when a trace.json "
                                                  "is written",
    ("mpviz.cuda.backends", "mpviz.cuda.cupy_backend"): "imports CuPy: only when CUDA is used",
    ("mpviz.examples.debugging", "mpviz.multiprocessing.spawn"): _PROGRAM,
    ("mpviz.examples.notebook_workers_2", "mpviz.trace"): _PROGRAM,
    ("mpviz.examples.training", "mpviz.multiprocessing"): _PROGRAM,
    ("mpviz.examples.your_program", "mpviz.trace"): _PROGRAM,
    ("mpviz.exercises.nb07", "mpviz.trace"): _CHECKER,
    ("mpviz.exercises.nb08", "mpviz.examples"): _CHECKER,
    ("mpviz.exercises.nb08", "mpviz.examples.notebook_workers_2"): _CHECKER,
    ("mpviz.exercises.nb08", "mpviz.multiprocessing"): _CHECKER,
    ("mpviz.exercises.nb08", "mpviz.trace"): _CHECKER,
    ("mpviz.exercises.nb09", "mpviz.scenarios.puzzles"): _CHECKER,
    ("mpviz.exercises.nb09", "mpviz.stepper"): _CHECKER,
    ("mpviz.exercises.nb09", "mpviz.stepper.control"): _CHECKER,
    ("mpviz.exercises.nb13", "mpviz.examples.dataloader_watch"): _CHECKER,
    ("mpviz.exercises.nb13", "mpviz.examples.your_program"): _CHECKER,
    ("mpviz.multiprocessing._codec", "mpviz.multiprocessing.reductions"):
        "reductions needs NumPy: a child that passes only numbers starts without it",
    ("mpviz.multiprocessing.reductions", "mpviz.cuda"): "only a CUDA tensor goes to mpviz.cuda",
    ("mpviz.scenarios", "mpviz.scenarios.puzzles"): "the puzzles load the stepper: at step()",
    ("mpviz.scenarios", "mpviz.scenarios.runner"): "the runner loads the recorder: at start()",
    ("mpviz.scenarios._common", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.trace.dist_hooks", "mpviz.trace.trace"): "the rendezvous's end only: the hooks load in every traced rank; Trace is the reader's",
    ("mpviz.trace.dist_verdict", "mpviz.trace.watchdog"): "a cycle: the watchdog asks dist_verdict first, dist_verdict borrows its labels",
    ("mpviz.trace.dist_verdict", "mpviz.trace.stuck"): "a running rank's place (stacks) only when a verdict is worded",
    ("mpviz.trace.frames", "mpviz.trace.stuck"): "a recorded process loads the verdict's wording only when an exception ends one of its threads",
    ("mpviz.trace.launcher", "mpviz.trace.dist_verdict"): "only a program that used torch.distributed and failed",
    ("mpviz.trace.launcher", "mpviz.trace.analysis"): "only when a process of the run ended by a signal",
    ("mpviz.trace.reader", "mpviz.trace.native"): "the C reader builds at first use; MPVIZ_PURE_PYTHON never loads it",
    ("mpviz.trace.torch_hooks", "mpviz.trace.dist_hooks"): "only where torch.distributed is available",
    ("mpviz.trace.watchdog", "mpviz.trace.dist_verdict"): "a cycle (see dist_verdict -> watchdog); only at a hang",
    ("mpviz.scenarios._common", "mpviz.trace.autostart"): _RECORDER_ONLY,
    ("mpviz.scenarios._common", "mpviz.trace.recorder"): _RECORDER_ONLY,
    ("mpviz.scenarios._driver", "mpviz.scenarios._common"):
        "a script: its imports wait until it has set up sys.path and the recorder",
    ("mpviz.scenarios._driver", "mpviz.trace"):
        "a script: its imports wait until it has set up sys.path and the recorder",
    ("mpviz.scenarios.cli", "mpviz.viz.timeline"): "matplotlib: only when a picture is asked",
    ("mpviz.scenarios.cuda_producer_exits", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.cuda_release_late", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.cuda_repass", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.cuda_same_queue", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.fs_leak", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.non_leaf_put", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.oom_killed", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.oom_killed", "mpviz.trace.recorder"): _RECORDER_ONLY,
    ("mpviz.scenarios.puzzles", "mpviz.stepper.control"):
        "the stepper imports the puzzles it runs (its _driver): loaded at step()",
    ("mpviz.scenarios.small_shm", "mpviz.errors"): _PROGRAM,
    ("mpviz.scenarios.small_shm", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.scenarios.small_shm", "mpviz.sharing.segment"): _PROGRAM,
    ("mpviz.scenarios.small_shm", "mpviz.trace.autostart"): _RECORDER_ONLY,
    ("mpviz.scenarios.small_shm", "mpviz.trace.recorder"): _RECORDER_ONLY,
    ("mpviz.scenarios.spawn_error", "mpviz.multiprocessing"): _DRIVEN,
    ("mpviz.sharing.segment", "mpviz._speedups"): "builds atomic.c: at the first mapping, not import",
    ("mpviz.stepper._driver", "mpviz.scenarios._common"):
        "a script: its imports wait until it has set up sys.path and the gate",
    ("mpviz.stepper._driver", "mpviz.scenarios.puzzles"):
        "a script: its imports wait until it has set up sys.path and the gate",
    ("mpviz.stepper._driver", "mpviz.stepper.gate"):
        "a script: its imports wait until it has set up sys.path and the gate",
    ("mpviz.stepper._driver", "mpviz.trace"):
        "a script: its imports wait until it has set up sys.path and the gate",
    ("mpviz.stepper_widget", "mpviz.scenarios"): "ipywidgets' module loads for a Stepper only",
    ("mpviz.stepper_widget", "mpviz.stepper.control"): "ipywidgets' module loads for a Stepper only",
    ("mpviz.trace", "mpviz.trace.trace"):
        "the core's `from ..trace import recorder` keeps `import mpviz` cheap (see there)",
    ("mpviz.trace.autostart", "mpviz.trace.hooks"): "a fresh interpreter joins only if told to",
    ("mpviz.trace.hooks", "mpviz.trace.autostart"): (
        "only a fork server's child registers Ctrl-C stacks again (autostart imports hooks)"),
    ("mpviz.trace.autostart", "mpviz.trace.recorder"): "a fresh interpreter joins only if told to",
    ("mpviz.trace.autostart", "mpviz.trace.waits"): (
        "a traced program's exit looks at its queue.Queues (loaded with the hooks by then)"),
    ("mpviz.trace.autostart", "mpviz.trace.torch_hooks"): "only once the program imports torch",
    ("mpviz.trace.hooks", "mpviz.trace.internals"): "the interpreter's internals: checked once",
    ("mpviz.trace.internals", "mpviz.trace.hooks"):
        "hooks asks internals what is missing; internals reads hooks' saved originals",
    ("mpviz.trace.launcher", "mpviz.trace.stuck"): "only for a run that hangs",
    ("mpviz.trace.launcher", "mpviz.trace.trace"): "only when reading the run back",
    ("mpviz.trace.launcher", "mpviz.trace.watchdog"): "only with a hang watchdog asked for",
    ("mpviz.trace.messages", "mpviz.trace.native"): "queue_hooks.c: only where the C Writer records",
    ("mpviz.trace.recorder", "mpviz.trace.native"): "writer.c is built, once, when recording starts",
    ("mpviz.trace.stuck", "mpviz.trace.watchdog"): "the watchdog imports stuck: labels borrowed",
    ("mpviz.trace.torch_hooks", "mpviz.trace.hooks"): "hooks installs torch_hooks when torch comes",
    ("mpviz.trace.trace", "mpviz.trace.chrome"): "the Chrome export: only when asked",
    ("mpviz.trace.trace", "mpviz.trace.hooks"): "reading a trace (`mpviz trace`) patches nothing",
    ("mpviz.trace.trace", "mpviz.trace.torch_hooks"): "real torch's sharing: only when recording",
    ("mpviz.trace.watchdog", "mpviz.trace.autostart"): "only when a child was interrupted",
    ("mpviz.trace.watchdog", "mpviz.trace.launcher"): "the launcher imports the watchdog",
    ("mpviz.trace.watchdog", "mpviz.trace.stuck"): "stuck imports the watchdog",
    ("mpviz.viz.memory_map", "mpviz.sharing.shm_manager"):
        "the fate of a name left in /dev/shm: only when a picture shows one",
    ("mpviz.widgets", "mpviz.scenarios"): "a widget for a scenario loads the catalog only then",
}


def lazy_imports():
    """{(importer, imported): first line} for each import of a module of mpviz made inside a
    function (or under a top-level ``if``/``try`` that runs later: not at the top level). The
    imported module is the deepest one named: ``from mpviz.viz import timeline`` is timeline."""
    modules = all_modules()
    known = set(modules)
    found = {}
    for module in modules:
        at_top = {name for name, _ in imports_of(module, top_level_only=True)}
        by_line = {}
        for name, line in imports_of(module):
            if name in at_top:
                continue
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                           if ".".join(parts[:i]) in known), None)
            if target and target != module and not module.startswith(target + "."):
                by_line.setdefault(line, set()).add(target)
        for line, targets in sorted(by_line.items()):
            for target in targets:
                if not any(other.startswith(target + ".") for other in targets):
                    found.setdefault((module, target), line)
    return found


def _says_why(importer, imported):
    if (importer, imported) in LAZY_IMPORTS:
        return True
    parts = imported.split(".")        # a back edge names the package the cycle runs through
    return any((importer, ".".join(parts[:i])) in LAZY_BACK_EDGES for i in range(1, len(parts) + 1))


def test_every_import_inside_a_function_says_why():
    found = lazy_imports()
    unlisted = {pair: line for pair, line in found.items() if not _says_why(*pair)}
    assert not unlisted, (f"imports made inside a function, with no reason given: {unlisted} "
                          f"((importer, imported): line). Fix: import at the top, or add the pair "
                          f"to LAZY_IMPORTS with one line of why")
    stale = [pair for pair in LAZY_IMPORTS if pair not in found]
    assert not stale, f"LAZY_IMPORTS names imports that are gone: {stale}. Fix: remove them"
    assert not set(LAZY_IMPORTS) & set(LAZY_BACK_EDGES), "a pair is in both lists: keep one"


def test_the_lazy_scan_counts_an_import_inside_a_function():
    found = lazy_imports()
    assert ("mpviz.trace.recorder", "mpviz.trace.native") in found       # inside writer_class
    assert ("mpviz.trace.trace", "mpviz.trace.chrome") in found          # inside Trace.to_chrome
    assert not any(importer == "mpviz._proc" for importer, _ in found)   # imports none of ours
