"""Put on PYTHONPATH by ``python -m mpviz trace``: every Python process started under it records.

Python imports a module named ``sitecustomize`` at startup if one is on the path. This one starts
mpviz's recorder when ``MPVIZ_TRACE_DIR`` is set, then runs the ``sitecustomize`` it shadows (a
distribution may ship its own), so the traced program sees the environment it would see anyway.
"""
import os
import sys

if os.environ.get("MPVIZ_TRACE_DIR"):
    try:
        from mpviz.trace import autostart
        autostart.boot()
    except Exception as exc:  # never stop the program because recording failed
        print(f"mpviz.trace: could not start recording in pid {os.getpid()}: {exc!r}",
              file=sys.stderr)


def _run_shadowed():
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_shadowed()
