"""Every module header under mpviz/ teaches in at most 25 lines.

A module's docstring is the first thing a student reads: how the module works, the one diagram
that matters. History, figures and the detail of one function belong elsewhere (next to the code
they explain, or in docs/PERFORMANCE.md), or the header grows until nobody reads it. The C files'
top comments (writer.c, queue_hooks.c) are held to the same length.
"""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 25


def header_lines(path):
    """How many source lines the module's header spans (None: it has none)."""
    text = path.read_text()
    if path.suffix == ".c":
        top = re.match(r"\s*/\*.*?\*/", text, re.S)
        return len(top.group(0).strip().splitlines()) if top else None
    doc = ast.get_docstring(ast.parse(text), clean=False)
    return None if doc is None else len(doc.strip("\n").splitlines())


def test_module_headers_are_short():
    files = sorted((ROOT / "mpviz").rglob("*.py")) + sorted((ROOT / "mpviz").rglob("*.c"))
    assert len(files) > 50, "the scan found too few modules: is ROOT right?"
    offenders = []
    for path in files:
        n = header_lines(path)
        if n is not None and n > MAX_LINES:
            offenders.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not offenders, (
        f"module headers longer than {MAX_LINES} lines:\n  " + "\n  ".join(offenders)
        + "\nFix: move detail next to the code it explains or to docs/PERFORMANCE.md "
        "(its section 'Moved from module headers')."
    )
