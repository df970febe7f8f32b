"""mpviz's C accelerators, in one folder, and how one is built on first use -- or why not.

Each C file here does what a Python function elsewhere does, faster; the Python is the reference,
read first, and a test runs both and compares (``TWINS`` names all three; tests/test_tour.py
checks the names). Nothing here may fail loudly: ``build(path, module)`` decides once::

    build(path, module)
      not CPython on Linux ........................................ (None, why)
      <cache>/<stem>-<key>.so exists .............................. import it
      <cache>/<stem>-<key>.failed exists (an earlier try failed) .. (None, why)
      else compile:  cc -O2 -shared -fPIC -pthread -I<Python.h dir> <path> -o <tmp>
                     then os.replace(<tmp>, <cache>/<stem>-<key>.so) ... import it
           no compiler, no Python headers ......................... (None, why) (tried again next time)
           a compile error ......................................... (None, why), and <key>.failed
                                                                     keeps the compiler's output

<key> hashes the C file and this Python: an edited file or another Python never loads a stale
build. <cache>: :func:`cache_dir`. Built on first use, not by setup.py: the same works after
``pip install -e .``, from a plain checkout on ``sys.path`` and in spawned children. This module
knows nothing of what it builds: who loads what, and when, is said where the module is used
(trace/native.py, sharing/segment.py). Adapted from torch.utils.cpp_extension.load (a build into
a cache keyed by the source); left out: ninja, file locks (the atomic rename does), Windows, macOS.
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))

# C file: (the Python it mirrors, the test that runs both and compares them), as path:name
TWINS = {
    "writer.c": ("mpviz/trace/recorder.py:Writer",
                 "tests/test_trace_writer.py:test_both_writers_encode_the_same_bytes"),
    "queue_hooks.c": ("mpviz/trace/messages.py:install_native",
                      "tests/test_trace_writer.py:test_queue_hooks_record_each_message_once_with_either_writer"),
    "json_events.c": ("mpviz/trace/launcher.py:_json_into",
                      "tests/test_trace_chrome.py:test_trace_json_is_the_same_bytes_json_dumps_writes"),
    "atomic.c": ("mpviz/sharing/segment.py:choose_atomic_add",
                 "tests/test_handoff.py:test_the_count_is_exact_when_processes_add_at_once"),
}


def source(name):
    """The path of C file `name` (a key of ``TWINS``) in this folder."""
    return os.path.join(HERE, name)


def cache_dir():
    """Where builds are kept: ``$MPVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/mpviz``, else
    ``~/.cache/mpviz``."""
    if os.environ.get("MPVIZ_CACHE_DIR"):
        return os.environ["MPVIZ_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mpviz")


def build(path, module_name):
    """Build the C file `path` into the cache (once) and import it as `module_name`.

    Returns ``(module, None)``, or ``(None, why)``: never raises.

    The build's <key> is a hash of the C file (and of the files it includes as
    ``#include "name"``) and of this Python (version, include path, extension suffix), so an
    edited file or another Python never loads a stale build. The rename is atomic: processes
    compiling at the same moment each finish their own file and the last rename wins, with
    identical contents."""
    try:
        return _build_and_import(path, module_name)
    except Exception as exc:          # an optional accelerator: never an error
        return None, f"{type(exc).__name__}: {exc}"


def _build_and_import(path, module_name):
    what = os.path.basename(path)
    if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
        return None, f"{what} is built for CPython on Linux only"
    with open(path, "rb") as f:
        source = f.read()
    for name in re.findall(rb'^#include "([^"]+)"', source, re.M):   # its own files (writer.c's
        with open(os.path.join(os.path.dirname(path), name.decode()), "rb") as f:  # hooks): an
            source += b"\0" + f.read()                                # edit there is a new build
    include = sysconfig.get_paths()["include"]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    key = hashlib.sha256(b"\0".join([source, sys.version.encode(), include.encode(),
                                     suffix.encode()])).hexdigest()[:16]
    directory = cache_dir()
    stem = module_name.rpartition(".")[2]          # "_writer": PyInit__writer in the C file
    built = os.path.join(directory, f"{stem}-{key}{suffix}")
    failed = os.path.join(directory, f"{stem}-{key}.failed")
    if not os.path.exists(built):
        if os.path.exists(failed):
            return None, f"an earlier build failed, see {failed} (delete it to try again)"
        why = _compile(path, include, directory, built, failed)
        if why:
            return None, why
    spec = importlib.util.spec_from_file_location(module_name, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, None


def _compiler():
    configured = (sysconfig.get_config_var("CC") or "").split()
    for name in [os.environ.get("CC", "")] + configured[:1] + ["cc", "gcc", "clang"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compile(path, include, directory, built, failed):
    """Compile `path` into `built`; None if that worked, else why not."""
    cc = _compiler()
    if cc is None:
        return "no C compiler found (set CC, or install gcc)"
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers in {include} (install the python3-dev package)"
    os.makedirs(directory, exist_ok=True)
    tmp = f"{built}.{os.getpid()}.tmp"
    command = [cc, "-O2", "-shared", "-fPIC", "-pthread", "-I", include, path, "-o", tmp]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            with open(failed, "w") as f:
                f.write(" ".join(command) + "\n\n" + result.stdout + result.stderr)
            return f"compiling {os.path.basename(path)} failed, see {failed}"
        os.replace(tmp, built)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
