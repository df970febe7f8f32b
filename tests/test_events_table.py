"""events.KINDS is the one table of event kinds: checked here against the code that emits them.

The source is read, not run: every ``emit(kind, ...)``, ``emit_at(ts, kind, ...)``,
``queue_event(ts, kind, ...)`` and writer.c ``Tap(call, kind, ...)`` call in mpviz/ (Python, by
its syntax tree), and the kinds writer.c writes by itself (a regex over its C). A kind emitted but
missing from the table, a row no code emits, or an arg a call passes but its row does not name,
fails -- so the table a student reads is the vocabulary the recorder writes.

And one way to ask "are we recording?": ``recorder.ENABLED`` is always ``writer is not None``.
"""
import ast
import os
import re

import pytest

import mpviz.trace as mt
from mpviz.trace import events, recorder

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "mpviz")

# The calls that record an event, and where their kind is among the positional args.
EMITTERS = {"emit": 0, "emit_at": 1, "queue_event": 1, "Tap": 1, "tap": 1}
# The recorder's own layers pass their caller's kind on: the kind is found at their callers.
FORWARDERS = {("trace/recorder.py", name) for name in ("emit", "emit_at", "queue_event")}


def _python_files():
    for directory, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def _called_name(call):
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)


class _Module:
    """One source file's tree, with what the scan needs to follow a kind that is not a literal."""

    def __init__(self, path):
        self.rel = os.path.relpath(path, PACKAGE)
        with open(path) as f:
            self.tree = ast.parse(f.read(), path)
        self.parent = {c: n for n in ast.walk(self.tree) for c in ast.iter_child_nodes(n)}
        self.dicts = {t.id: n.value for n in self.tree.body if isinstance(n, ast.Assign)
                      for t in n.targets if isinstance(t, ast.Name)
                      and isinstance(n.value, ast.Dict)}

    def function_of(self, node):
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def calls_of(self, name):
        return [n for n in ast.walk(self.tree)
                if isinstance(n, ast.Call) and _called_name(n) == name]

    def kinds(self, node, seen=()):
        """The kinds expression `node` can be: a list of (kind, call of a wrapper or None).
        Raises LookupError when it cannot tell."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [(node.value, None)]
        if isinstance(node, ast.IfExp):
            return self.kinds(node.body, seen) + self.kinds(node.orelse, seen)
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in self.dicts):           # a module-level table of kinds
            return [k for v in self.dicts[node.value.id].values for k in self.kinds(v, seen)]
        if isinstance(node, ast.Name):                      # a parameter: look at the callers
            fn = self.function_of(node)
            params = [a.arg for a in fn.args.args] if fn else []
            if fn is not None and node.id in params and fn.name not in seen:
                at = params.index(node.id) - (params[:1] in (["self"], ["cls"]))
                found = []
                for call in self.calls_of(fn.name):
                    arg = (call.args[at] if at < len(call.args) else
                           next((k.value for k in call.keywords if k.arg == node.id), None))
                    if arg is not None:
                        found += [(k, call) for k, _ in self.kinds(arg, seen + (fn.name,))]
                if found:
                    return found
        raise LookupError(f"{self.rel}:{node.lineno}: cannot tell which event kind "
                          f"`{ast.unparse(node)}` is. Fix: pass the kind as a string literal "
                          f"(or teach tests/test_events_table.py this way of naming one)")


def _arg_names(module, call, at):
    """The arg names a call passes: its keywords, and the keys of its args dict (a literal, or
    a dict built in the same function: ``args = {...}``, ``args["handles"] = ...``)."""
    names = {k.arg for k in call.keywords if k.arg}
    if _called_name(call) == "queue_event":
        return names | {"queue", "msg", "nbytes", "sig"}
    rest = call.args[at + 1:at + 2]
    if not rest:
        return names
    arg, fn = rest[0], module.function_of(call)
    literals = [arg] if isinstance(arg, ast.Dict) else []
    if isinstance(arg, ast.Name) and fn is not None:
        for n in ast.walk(fn):
            if not isinstance(n, ast.Assign):
                continue
            for t in n.targets:
                if isinstance(t, ast.Name) and t.id == arg.id and isinstance(n.value, ast.Dict):
                    literals.append(n.value)
                for s in ast.walk(t):                   # args["handles"] (, x) = ...
                    if (isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name)
                            and s.value.id == arg.id and isinstance(s.slice, ast.Constant)):
                        names.add(s.slice.value)
    for d in literals:
        names |= {k.value for k in d.keys if isinstance(k, ast.Constant)}
    return names


def emitted_in_python():
    """{kind: {arg names}} over mpviz/*.py, and {kind: [where]}."""
    kinds, where = {}, {}
    for path in _python_files():
        module = _Module(path)
        for call in ast.walk(module.tree):
            if not isinstance(call, ast.Call) or _called_name(call) not in EMITTERS:
                continue
            at = EMITTERS[_called_name(call)]
            if len(call.args) <= at:
                continue
            fn = module.function_of(call)
            if fn is not None and (module.rel, fn.name) in FORWARDERS:
                continue
            for kind, wrapper in module.kinds(call.args[at]):
                names = _arg_names(module, call, at)
                if wrapper is not None:
                    names |= {k.arg for k in wrapper.keywords if k.arg}
                kinds.setdefault(kind, set()).update(names)
                where.setdefault(kind, []).append(f"{module.rel}:{call.lineno}")
    return kinds, where


def emitted_in_c():
    """The kinds writer.c writes by itself: the interned strs it passes as a kind to
    write_event/write_queue_event (the kinds its Taps write come from Python: see above)."""
    c = ""
    for name in ("writer.c", "queue_hooks.c"):        # (writer.c includes queue_hooks.c)
        with open(os.path.join(PACKAGE, "_speedups", name)) as f:
            c += f.read()
    words = re.findall(r'"([^"]*)"', re.search(r"words\[\] = \{(.*?)\};", c, re.S).group(1))
    targets = re.findall(r"&(\w+)", re.search(r"interned\[\] = \{(.*?)\};", c, re.S).group(1))
    assert len(words) == len(targets), "writer.c's words[] and interned[] no longer pair up"
    interned = dict(zip(targets, words))
    used = re.findall(r"write_(?:queue_)?event\(\s*[^,]+,\s*[^,]+,\s*([A-Z_]+)\s*,", c)
    assert used, "no kind found in writer.c: has write_event been renamed? Update this test"
    return {interned[name] for name in used}


def test_every_emitted_kind_is_in_the_table():
    kinds, where = emitted_in_python()
    missing = {k: where[k] for k in kinds if k not in events.KINDS}
    missing.update({k: ["_speedups/writer.c"] for k in emitted_in_c() if k not in events.KINDS})
    assert not missing, (f"emitted but not in mpviz/trace/events.py's KINDS: {missing}. Fix: "
                         f"add a row (its args, who emits it)")


def test_every_row_of_the_table_is_emitted():
    emitted = set(emitted_in_python()[0]) | emitted_in_c()
    never = sorted(set(events.KINDS) - emitted)
    assert not never, (f"in events.KINDS but emitted nowhere in mpviz/: {never}. Fix: remove "
                       f"the row, or emit it with a literal kind the scan can see")


def test_every_arg_a_call_passes_is_named_in_its_row():
    kinds, where = emitted_in_python()
    unnamed = {k: sorted(names - set(events.arg_names(k)))
               for k, names in kinds.items() if k in events.KINDS}
    unnamed = {k: v for k, v in unnamed.items() if v}
    assert not unnamed, (f"args emitted but not named in events.KINDS: {unnamed}. Fix: name "
                         f"them in the kind's row")


def test_the_scan_sees_what_it_must():
    # The scan itself, on the cases it must follow: a literal, both arms of an `if`, a kind
    # looked up in a module's table, a kind passed down from a wrapper's callers, C's own.
    kinds, _ = emitted_in_python()
    assert {"shm.create", "lock.acquire", "lock.timeout", "queue.get", "pipe.recv",
            "torch.unsupported", "torch.hook_failed", "queue.feed"} <= set(kinds)
    assert {"version", "supported", "reason"} <= kinds["torch.unsupported"]   # via _say
    assert {"handles", "sig"} <= kinds["queue.feed"]       # args["handles"] = ... counts
    assert emitted_in_c() == {"mark", "queue.put"}
    assert events.arg_names("process.reaped") == ["child", "exitcode", "signal", "by", "at"]


# -- one way to ask "are we recording?" ------------------------------------------------------

def test_only_set_writer_changes_enabled_and_writer():
    """``ENABLED`` and ``writer`` change together, in recorder._set_writer, and nowhere else."""
    changes = []
    for path in _python_files():
        module = _Module(path)
        for node in ast.walk(module.tree):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                for n in ast.walk(t):
                    fn = module.function_of(node)
                    here = f"{module.rel}:{node.lineno}"
                    if (isinstance(n, ast.Attribute) and n.attr in ("ENABLED", "writer")
                            and isinstance(n.value, ast.Name) and n.value.id == "recorder"):
                        changes.append(here)
                    if (module.rel == "trace/recorder.py" and isinstance(n, ast.Name)
                            and n.id in ("ENABLED", "writer") and fn is not None
                            and any(isinstance(s, ast.Global) and n.id in s.names
                                    for s in ast.walk(fn))
                            and fn.name != "_set_writer"):
                        changes.append(here)
    assert not changes, (f"recorder.ENABLED or recorder.writer set outside "
                         f"recorder._set_writer: {changes}. Fix: call _set_writer(w), which "
                         f"sets both (and tells writer.c)")


def _agree():
    return recorder.ENABLED == (recorder.writer is not None)


def test_enabled_is_writer_is_not_none_through_a_life(tmp_path):
    seen = [(recorder.ENABLED, _agree())]
    with mt.record(tmp_path / "t"):
        seen.append((recorder.ENABLED, _agree()))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                          # a forked child records into a log of its own
            ok = recorder.ENABLED and _agree() and recorder.writer is not None
            recorder.stop()
            ok = ok and not recorder.ENABLED and _agree()
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.close(w)
        child_ok = os.read(r, 1)
        os.close(r)
        assert os.waitpid(pid, 0)[1] == 0
        seen.append((recorder.ENABLED, _agree()))
        with pytest.warns(recorder.RecorderWarning, match="on purpose"):
            recorder._fail("failing on purpose, in a test")   # a failed log: recording stops
        seen.append((recorder.ENABLED, _agree()))
    seen.append((recorder.ENABLED, _agree()))
    assert child_ok == b"1"
    assert seen == [(False, True), (True, True), (True, True), (False, True), (False, True)]
