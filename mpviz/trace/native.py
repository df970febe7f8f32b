"""The C Writer (mpviz/_speedups/writer.c): built on first use, loaded once per process -- or why not.

The C Writer is optional: recording works without it, only slower (recorder.py's Python Writer
writes the same bytes). ``load()`` is called when a process starts recording
(``recorder.writer_class``), and decides once per process: writer.c is built and imported by
``mpviz._speedups.build`` (the cache, the compiler, what can go wrong: see there), or ``problem``
says, in words, why the C Writer is not used. This module does not know the recorder: the
recorder asks it for the module, and connects that module's hooks to itself.
"""
import sysconfig

from .._speedups import build, source

SOURCE = source("writer.c")
MODULE = "mpviz._speedups._writer"   # PyInit__writer in writer.c

problem = None           # why the C Writer is not used (None: it is, or load() not called yet)
_tried = False
_module = None


def load():
    """The compiled ``_writer`` module, built now if needed; None if it cannot be had."""
    global _tried, _module, problem
    if not _tried:
        _tried = True
        if sysconfig.get_config_var("Py_GIL_DISABLED"):   # writer.c's Writer: "The GIL is the lock"
            problem = "writer.c relies on the GIL; this Python has none"
        else:
            _module, problem = build(SOURCE, MODULE)
    return _module
