"""Building the C Writer (writer.c) on first use, and loading it -- or saying why not.

The C Writer is optional: recording works without it, only slower (recorder.py's Python Writer
writes the same bytes). So nothing here may fail loudly. ``load()`` is called when a process
starts recording, and decides once per process::

    load()
      not CPython on Linux ........................................ None  (Python Writer)
      <cache>/_writer-<key>.so exists ............................. import it
      <cache>/_writer-<key>.failed exists (an earlier try failed) . None
      else compile:  cc -O2 -shared -fPIC -pthread -I<Python.h dir> writer.c -o <tmp>
                     then os.replace(<tmp>, <cache>/_writer-<key>.so) ... import it
           no compiler, no Python headers, a compile error ........ None, and <key>.failed
                                                                     keeps the compiler's output

<key> is a hash of writer.c and of this Python (version, headers, extension suffix), so an edited
writer.c or another Python never loads a stale build. The rename is atomic: processes compiling at
the same moment each finish their own file and the last rename wins, with identical contents.
<cache> is ``$MPVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpviz``, else ``~/.cache/mpviz``. Why a
build on first use rather than a setup.py extension: the same works after ``pip install -e .``,
from a plain checkout on ``sys.path``, and in spawned children, with no step to forget and no
stale binary in the source tree. ``problem`` says, in words, why the C Writer is not used.

Adapted from torch.utils.cpp_extension.load (a just-in-time build into a cache keyed by the
source); left out: ninja, file locks (the atomic rename does), Windows and macOS.
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer.c")
MODULE = "mpviz.trace._writer"   # PyInit__writer in writer.c

problem = None           # why the C Writer is not used (None: it is, or load() not called yet)
_tried = False
_module = None


def cache_dir():
    """Where builds are kept (see the module docstring)."""
    if os.environ.get("MPVIZ_CACHE_DIR"):
        return os.environ["MPVIZ_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpviz")


def load():
    """The compiled ``_writer`` module, built now if needed; None if it cannot be had."""
    global _tried, _module, problem
    if not _tried:
        _tried = True
        try:
            _module = _build_and_import()
        except Exception as exc:          # an optional accelerator: never an error
            problem, _module = f"{type(exc).__name__}: {exc}", None
    return _module


def _build_and_import():
    global problem
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        problem = "the C Writer is built for CPython on Linux only"
        return None
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        problem = "the C Writer appends while holding the GIL; this Python has none"
        return None
    with open(SOURCE, "rb") as f:
        source = f.read()
    include = sysconfig.get_paths()["include"]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256(b"\0".join([source, sys.version.encode(), include.encode(),
                                     suffix.encode()])).hexdigest()[:16]
    directory = cache_dir()
    built = os.path.join(directory, f"_writer-{key}{suffix}")
    failed = os.path.join(directory, f"_writer-{key}.failed")
    if not os.path.exists(built):
        if os.path.exists(failed):
            problem = f"an earlier build failed, see {failed} (delete it to try again)"
            return None
        if not _compile(include, directory, built, failed):
            return None
    spec = importlib.util.spec_from_file_location(MODULE, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiler():
    configured = (sysconfig.get_config_var("CC") or "").split()
    for name in [os.environ.get("CC", "")] + configured[:1] + ["cc", "gcc", "clang"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compile(include, directory, built, failed):
    global problem
    cc = _compiler()
    if cc is None:
        problem = "no C compiler found (set CC, or install gcc)"
        return False
    if not os.path.exists(os.path.join(include, "Python.h")):
        problem = f"no Python headers in {include} (install the python3-dev package)"
        return False
    os.makedirs(directory, exist_ok=True)
    tmp = f"{built}.{os.getpid()}.tmp"
    command = [cc, "-O2", "-shared", "-fPIC", "-pthread", "-I", include, SOURCE, "-o", tmp]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            problem = f"compiling writer.c failed, see {failed}"
            with open(failed, "w") as f:
                f.write(" ".join(command) + "\n\n" + result.stdout + result.stderr)
            return False
        os.replace(tmp, built)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
