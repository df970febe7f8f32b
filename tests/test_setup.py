"""What a newcomer meets first: the names the README writes, the set-up commands, the CLI's Python.

Each check runs a fresh interpreter or the real ``./run`` script where what it tests is what
happens on first use (a lazily loaded name, a missing package, a venv made from nothing).
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh_python(code, **env):
    """Run `code` in a new interpreter that imports this checkout's mpviz; its stdout."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": ROOT, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_lazy_names_are_bound_on_first_use():
    """`mpviz.trace.mark(...)` as the README writes it: the first access loads trace.py, every
    later one is a plain attribute of the module (no import run per event)."""
    out = fresh_python(
        "import mpviz\n"
        "t = mpviz.trace\n"
        "assert 'mark' not in vars(t), 'loaded lazily: import mpviz stays cheap'\n"
        "t.mark\n"
        "from mpviz.trace import trace as impl\n"
        "for name in ('mark', 'record', 'load', 'Trace'):\n"
        "    assert vars(t)[name] is getattr(impl, name), name\n"
        "print('ok')\n")
    assert out.strip() == "ok"
