"""Where recording plugs into the stdlib: processes, threads, and children that record by themselves.

``install()`` replaces a few methods of stdlib classes, code we cannot edit (mpviz's Process/Pool
are built on them; its Queue records itself); ``uninstall()`` puts the originals back. Every one
checks ``recorder.ENABLED`` and otherwise behaves exactly like the original, because a bound method
taken while recording (a Pool's ``_quick_put``) can outlive the recording.

How each kind of child starts recording, with no change to user code::

    fork         os.register_at_fork (recorder.py): the child opens its own log at once
    spawn        the parent starts  python -c "<prefix>; from multiprocessing.spawn import
                 spawn_main; ..."  through util.spawnv_passfds; we insert a <prefix> that imports
                 mpviz.trace.autostart and calls boot(), which installs these hooks in the child.
                 The parent also adds {"dir": ..., "locks": [...]} to the spawn preparation data;
                 the child's (patched) spawn.prepare starts recording into that directory -- before
                 the child re-imports the parent's __main__, so that is recorded too.
    forkserver   the fork server is started the same way (so it has the hooks, but records
                 nothing itself); each child it forks gets the preparation data like a spawned one.
                 A fork server already running *without* the hooks when recording starts is
                 stopped, so the next Process starts a fresh one.
    exec'd       ``python -m mpviz trace``: a sitecustomize on PYTHONPATH calls boot() in every
    programs     Python process, which records when MPVIZ_TRACE_DIR is set (autostart/).
A Process's pickled arguments and sharedctypes' arenas cross too: see their sections below.

Adapted from VizTracer's patch.py (spawnv_passfds rewriting); left out: Windows.
"""
import functools
import os
import queue as thread_queue
import signal
import sys
import threading
import time

from multiprocessing import connection, heap, process, queues, reduction, spawn, synchronize, util

from .. import _stops
from . import frames, locks, messages, names, recorder, waits
from .events import queue_id

TRACE_KEY = "mpviz_trace"               # our key in the spawn preparation data
_orig = {}
_installed = []                          # (owner, attribute, original) while installed
_booted = False                          # this process runs the hooks for good (a child)
_role = None                             # "forkserver" in a fork server and its children


# --- processes, seen from the parent ------------------------------------------------------
#
# A Process's arguments: under spawn/forkserver the parent pickles the whole Process object
# (target, args) into the pipe that starts the child. A handle pickled there (a torch tensor's
# fd, a sharedctypes arena) is a message like any other: the parent records ``pipe.send`` on the
# pipe ``args-<child pid>`` with the number of handles, the child ``pipe.recv`` once it has
# unpickled them -- so the picture draws the arrow (mnist_hogwild's model reaching its workers).
# Under fork nothing is pickled: the child inherits the mappings (``shm.attach how="fork"``).

def _process_start(self):
    if _stops.pause: _stops.pause("process.start", None, name=self.name)  # stepped: see _stops.py
    if not recorder.ENABLED:
        return _orig["start"](self)
    ts = time.monotonic_ns()
    given = _queues_given(self)              # (before start(), which deletes self._args)
    ends = [g for g in given if str(g).startswith("conn-")]     # Pipe ends: waits.py
    if ends:
        self._mpviz_pipe_ends = ends         # (pickled with it: the child marks them)
    private = _private_tensors(self)
    target = getattr(getattr(self, "_target", None), "__qualname__", None)   # (start() drops it)
    recorder.take_handles()
    _orig["start"](self)                     # spawn/forkserver: pickles self (args) here
    handles = recorder.take_handles()
    method = getattr(self._popen, "method", None)
    recorder.emit_at(ts, "process.launch", child=self.pid, name=self.name,
                     start_method=method, **({"queues": given} if given else {}),
                     **({"target": target} if target else {}),
                     **({"daemon": True} if self.daemon else {}))
    if private and method == "fork":         # (pickled, under spawn, torch shares them)
        recorder.emit_at(ts, "process.private_args", child=self.pid, what=private)
    nbytes = self.__dict__.pop("_mpviz_pickled", None)
    if handles:                              # the arguments carried handles: a message
        pipe = names.arguments_pipe(self.pid)
        recorder.emit_at(ts, "pipe.send", pipe=pipe, msg=pipe, nbytes=nbytes, handles=handles)


def _private_tensors(proc):
    """["Linear (2 tensors, 20 B)", "a Tensor (4.0 KiB)"]: the torch tensors and modules among
    a Process's arguments (_in_arguments; and those an object of the program's own class among
    them holds, or the one whose method is its target) that are not in shared memory. Under
    fork the child gets a copy of them, page by page as either side writes: an optimizer's
    step in a Hogwild worker that was not given model.share_memory()'s tensors trains its own
    copy, and the parent's model never changes. Looked at only where the program has imported
    torch."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):
        return []
    out = []
    owner = getattr(getattr(proc, "_target", None), "__self__", None)   # target=trainer.train
    for value in _in_arguments(proc) + ([owner] if owner is not None else []):
        try:
            if isinstance(value, torch.nn.Module):
                found = [(type(value).__name__, value)]
            elif isinstance(value, torch.Tensor):
                found = [("a Tensor", value)]
            else:
                found = _modules_inside(torch, value)
            out += [words for words in map(_private_words, found) if words]
        except Exception:                    # (a tensor subclass, a meta tensor: not judged)
            continue
    return out


def _modules_inside(torch, value):
    """[("Trainer.model: Linear", module)]: the torch modules among the attributes of an object
    of the program's own class (a trainer, an agent that holds the model) -- one level, at
    most 32 attributes. Tensors alone are not looked for there (a config's, a Dataset's are
    read, not trained), nor inside a Dataset (each DataLoader worker reads its own copy)."""
    attrs = getattr(value, "__dict__", None)
    if not isinstance(attrs, dict) or type(value).__module__ in ("builtins", "functools") or \
            isinstance(value, torch.utils.data.Dataset) or \
            type(value).__module__.startswith(("torch.", "multiprocessing.")):
        return []
    return [(f"{type(value).__name__}.{attr}: {type(item).__name__}", item)
            for attr, item in list(attrs.items())[:32] if isinstance(item, torch.nn.Module)]


def _private_words(found):
    """"Linear (2 tensors, 20 B)" for a module or tensor not in shared memory; None if it is."""
    name, value = found
    tensors = list(value.parameters()) + list(value.buffers()) if name != "a Tensor" \
        else [value]
    mine = [t for t in tensors if t.device.type == "cpu" and not t.is_shared()]
    if not mine:
        return None
    size = names.human_bytes(sum(t.untyped_storage().nbytes() for t in mine))
    n = len(mine)
    return (f"{name} ({n} tensor{'s' if n > 1 else ''}, {size})" if
            len(tensors) > 1 or name != "a Tensor" else f"{name} ({size})")


def _queues_given(proc):
    """The ids of the queues among a Process's arguments (_in_arguments): a verdict can then
    say "Process-1 was given Queue 1 and ended without putting into it". A queue reached
    otherwise (a global under fork, a queue sent in a message) is not seen. The ends of the
    program's own Pipes among them count too (their ids: waits.marked_end), and its Events and
    Conditions (their waits' ids): "was given Event 1 and ended without setting it"."""
    found = []
    for value in _in_arguments(proc):
        if isinstance(value, (queues.Queue, queues.SimpleQueue)):
            try:
                qid = queue_id(value)
            except (AttributeError, OSError, TypeError):   # a queue not yet made, a subclass
                continue
        elif isinstance(value, (synchronize.Event, synchronize.Condition)):
            try:
                qid = waits.signal_id(value)
            except (AttributeError, OSError, TypeError):
                continue
        else:
            qid = waits.marked_end(value)
        if qid is not None and qid not in found:
            found.append(qid)
    return found


def _connections_given(proc):
    """The Connections among a Process's (or a Thread's) arguments (_in_arguments)."""
    return [v for v in _in_arguments(proc) if isinstance(v, connection._ConnectionBase)]


def _in_arguments(proc):
    """The values among a Process's arguments, and one level inside a tuple, list or dict of
    them (torch's mp.spawn hands the user's args to its wrapper as one tuple): a bounded look,
    for a Process given a big nested list.

    A loop, not a function that calls itself: a nested function that refers to itself is a
    reference cycle, and the list of values it holds (the program's Pipe ends, its queues)
    would outlive this call until the garbage collector ran -- keeping open a Pipe end the
    program had dropped, so that a traced program waited for an end of file that, untraced,
    comes (the docs' connection.wait() example without its w.close())."""
    found, budget = [], 256
    todo = [((tuple(getattr(proc, "_args", ()) or ()),
              dict(getattr(proc, "_kwargs", {}) or {})), 3)]
    while todo and budget > 0:
        value, depth = todo.pop()
        budget -= 1
        if depth and isinstance(value, (tuple, list)):
            todo.extend((item, depth - 1) for item in reversed(value[:64]))
        elif depth and isinstance(value, dict):
            todo.extend((item, depth - 1) for item in reversed(list(value.values())[:64]))
        else:
            found.append(value)
    return found


def _dump(obj, file, protocol=None):
    """reduction.dump, which spawn/forkserver's Popen pickles the Process object with: its size
    is the size of the arguments' message."""
    if not recorder.ENABLED or not isinstance(obj, process.BaseProcess):
        return _orig["dump"](obj, file, protocol)
    try:
        start = file.tell()
    except (AttributeError, OSError):
        return _orig["dump"](obj, file, protocol)
    _orig["dump"](obj, file, protocol)
    obj._mpviz_pickled = file.tell() - start


_args_received = None       # a spawned child, until _bootstrap: handles its arguments brought


def received_at_start():
    """Count one handle rebuilt while this child unpickles its Process object (torch_hooks.py
    calls this too): from spawn.prepare to _bootstrap, all that is unpickled is the arguments."""
    global _args_received
    if _args_received is not None:
        _args_received += 1


def _observe_exit(self):
    """Exits are seen twice: the child records ``process.exit`` when ``_bootstrap`` returns, and
    the parent records ``process.reaped`` (exit code, signal name) here, when ``join``/``is_alive``
    notices the end -- so a child killed by SIGKILL, which cannot write anything, still gets an
    end in the trace."""
    if not recorder.ENABLED or self._popen is None or self.__dict__.get("_mpviz_reaped"):
        return
    code = self._popen.returncode
    if code is not None:
        self._mpviz_reaped = True
        sig = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
        recorder.emit("process.reaped", child=self.pid, exitcode=code, signal=sig)


def _process_join(self, timeout=None):
    if _stops.pause: _stops.pause("process.join", None, name=self.name, pid=self.pid)  # stepped
    waits.process_join(_orig["join"], self, timeout)      # a wait on the child (waits.py)
    _observe_exit(self)


def _process_is_alive(self):
    alive = _orig["is_alive"](self)
    if not alive:
        _observe_exit(self)
    return alive


# --- processes, seen from the child -------------------------------------------------------

# A child's end is recorded once its exit functions have run: ``util._exit_function`` joins the
# Queues' feeder threads (a feeder still writing into a full pipe keeps the child alive). Up to
# 3.12 it ran inside ``_bootstrap``; since 3.13 (CPython gh-83856) it runs from ``atexit``, after
# ``_bootstrap`` has returned. There, the exit code is kept and ``process.exit`` is recorded at
# the end of _exit_function's last step (``_run_finalizers()``, held in its default arguments).

_exit_code = None              # 3.13+: what _bootstrap returned, until the exit functions ran
_error = None                  # ("FileNotFoundError: ...", "load (prog.py:7): `...`") that
                               # ended this child's run(), if one


def _exit_args():
    return {"error": _error[0], "at": _error[1]} if _error else {}


def _run_noting_error(run):
    """Run the Process's run(); an exception that ends it is kept for ``process.exit`` (then
    _bootstrap prints it and exits 1, as always): a verdict can say why a producer ended. (This
    frame is mpviz's: frames.py leaves it out of the printed traceback.)"""
    global _error
    try:
        return run()
    except Exception as exc:           # (SystemExit is an exit: its status says it)
        _error = (frames.error_words(exc), frames.raised_at(exc.__traceback__)[0])
        raise


def _process_bootstrap(self, parent_sentinel=None):
    global _args_received, _exit_code
    if recorder.ENABLED and _args_received:  # the other end of _process_start's pipe.send
        pipe = names.arguments_pipe(os.getpid())
        recorder.emit("pipe.recv", pipe=pipe, msg=pipe)
    _args_received = None
    if recorder.ENABLED:
        if "_mpviz_pipe_ends" in self.__dict__:   # spawn/forkserver: mark its Pipe ends again
            waits.mark_given(self, _connections_given(self))
        target = getattr(self, "_target", None)
        recorder.emit("process.bootstrap", name=self.name,
                      target=getattr(target, "__qualname__", None) if target else None)
        self.run = functools.partial(_run_noting_error, self.run)
    code = _orig["_bootstrap"](self, parent_sentinel)
    if recorder.ENABLED:
        torch_hooks = sys.modules.get("mpviz.trace.torch_hooks")
        if torch_hooks is not None:
            torch_hooks.looked_at_exit()     # what torch still maps, as Linux says
        if "_exit_function" in _orig:
            _exit_code = code          # recorded by _last_finalizers, after the exit functions
        else:
            recorder.emit("process.exit", exitcode=code, **_exit_args())
    return code


def _last_finalizers(minpriority=None, _run=util._run_finalizers):
    global _exit_code
    _run(minpriority)
    if minpriority is None and _exit_code is not None:
        code, _exit_code = _exit_code, None
        if recorder.ENABLED:
            recorder.emit("process.exit", exitcode=code, **_exit_args())


def _hook_exit_function():
    """3.13+: put _last_finalizers in util._exit_function's defaults (undone by uninstall)."""
    if sys.version_info < (3, 13) or "_exit_function" in _orig:
        return
    fn = util._exit_function
    defaults = fn.__defaults__ or ()
    if util._run_finalizers not in defaults:
        return                         # another Python: process.exit when _bootstrap returns
    _orig["_exit_function"] = defaults
    fn.__defaults__ = tuple(_last_finalizers if d is util._run_finalizers else d
                            for d in defaults)
    _installed.append((fn, "__defaults__", _orig, "_exit_function"))


# --- threads ------------------------------------------------------------------------------

def _thread_bootstrap_inner(self):
    if recorder.ENABLED:
        recorder.forget_thread()             # this ident may have belonged to a dead thread
        given = _in_arguments(self)                       # (a Thread has _args as a Process)
        ends = [waits.marked_end(c) for c in given if isinstance(c, connection._ConnectionBase)]
        ends = [end for end in ends if end is not None]
        tqueues = [waits.tqueue_id(q) for q in given if isinstance(q, thread_queue.Queue)]
        tqueues = [tq for tq in tqueues if tq is not None]
        del given
        recorder.emit("thread.start", name=self.name, daemon=self.daemon,
                      ident=threading.get_ident(),   # (self.ident: None yet, before 3.13)
                      **({"pipes": ends} if ends else {}),
                      **({"queues": tqueues} if tqueues else {}))
    try:
        _orig["_bootstrap_inner"](self)
    finally:
        if recorder.ENABLED:
            error, at, via = self.__dict__.get("_mpviz_error") or (None, None, None)
            recorder.emit("thread.exit", name=self.name, ident=self.ident,   # (frames.py)
                          **({"error": error, "at": at, "via": via} if error else {}))
        recorder.forget_thread()


# --- spawn and forkserver children ----------------------------------------------------------

def boot_prefix():
    """The Python statement we put in front of a child's ``-c`` program."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return (f"__import__('sys').path.append({root!r}); "
            f"__import__('mpviz.trace.autostart').trace.autostart.boot(); ")


_hooked_forkserver = None               # pid of a fork server started with our prefix


def _spawnv_passfds(path, args, passfds):
    global _hooked_forkserver
    args = list(args)
    prog = ""
    if "-c" in args:
        i = args.index("-c") + 1
        if i < len(args) and "resource_tracker" not in args[i]:
            prog = args[i]
            args[i] = boot_prefix() + prog
    pid = _orig["spawnv_passfds"](path, args, passfds)
    if "forkserver" in prog:
        _hooked_forkserver = pid
    return pid


def _get_preparation_data(name):
    data = _orig["get_preparation_data"](name)
    directory = recorder.current_directory()
    if directory is not None:
        data[TRACE_KEY] = {"dir": directory, "parent": os.getpid(),
                           "locks": sorted(locks.user_lock_ids),
                           "threading_locks": threading_locks_on()}
    return data


def _prepare(data):
    global _args_received
    cfg = data.pop(TRACE_KEY, None)
    _args_received = 0                       # the Process object is unpickled next
    if cfg is not None and recorder.current_directory() != cfg["dir"]:
        locks.user_lock_ids.update(cfg.get("locks", ()))
        if cfg.get("threading_locks"):
            _patch(locks.THREADING_PATCHES)
        how = "forkserver" if _role == "forkserver" else "spawn"   # forked by a fork server
        recorder.start(cfg["dir"], how, ppid=cfg.get("parent"))
    if _role == "forkserver":
        # The fork server ignores SIGINT, so its child forked with SIGINT ignored, and its fork
        # hook took no Ctrl-C stacks (autostart.register_stacks); Python's handler is back now
        from .autostart import register_stacks
        register_stacks()
    _orig["prepare"](data)


# --- sharedctypes: the stdlib heap's arenas ----------------------------------------------------
#
# ``Value``, ``Array``, ``RawArray`` live in the stdlib heap's *arenas* (multiprocessing/heap.py):
# each arena is one file in /dev/shm, unlinked at once and kept by its fd, mmapped -- a
# ``file_descriptor`` segment in our words, named by its file (``/pym-<pid>-<rand>``).
# ``Arena.__init__`` records ``shm.create`` (a new arena) or ``shm.attach`` (one rebuilt from a
# pickled fd in a spawned child); a forked child records ``shm.attach how="fork"`` for each arena
# it inherits. Not seen: the unmap when an arena is garbage-collected (rare before exit; an ended
# process maps nothing).

def _arena_init(self, size, fd=-1):
    _orig["Arena.__init__"](self, size, fd)
    if recorder.ENABLED:
        name = _arena_name(self)
        if name is not None:
            if fd != -1:
                received_at_start()
            recorder.emit("shm.create" if fd == -1 else "shm.attach", name=name,
                          strategy="file_descriptor", nbytes=size, via="multiprocessing.heap")


def _arena_name(arena):
    """The arena's file, as /proc/PID/maps names it: /dev/shm/pym-7-abc (deleted) -> /pym-7-abc."""
    try:
        target = os.readlink(f"/proc/self/fd/{arena.fd}")
    except (OSError, TypeError):
        return None
    return "/" + os.path.basename(target.removesuffix(" (deleted)"))


def _reduce_arena(arena):
    result = _orig["reduce_arena"](arena)
    if recorder.ENABLED:
        recorder.count_handle()              # this message (or Process start) carries its fd
    return result


def _arenas_inherited():
    """A forked child maps every arena its parent had: say so, for each."""
    if not recorder.ENABLED:
        return
    for arena in list(getattr(heap.BufferWrapper._heap, "_arenas", ())):
        name = _arena_name(arena)
        if name is not None:
            recorder.emit("shm.attach", name=name, strategy="file_descriptor",
                          nbytes=arena.size, how="fork", via="multiprocessing.heap")


def _install_heap():
    """Arena.__init__ and its reducer (the pickler's table holds the function itself)."""
    if "Arena.__init__" in _orig or not hasattr(heap, "rebuild_arena"):
        return                               # (done, or Windows: no fd-backed arenas)
    if not hasattr(heap, "Arena"):
        return                               # another Python: internals.py says so
    _orig["Arena.__init__"] = heap.Arena.__init__
    heap.Arena.__init__ = _arena_init
    _orig["reduce_arena"] = reduction.ForkingPickler._extra_reducers.get(heap.Arena)
    if _orig["reduce_arena"] is not None:
        reduction.register(heap.Arena, _reduce_arena)
    recorder._install_fork_hooks()           # the child's log opens before ours runs
    os.register_at_fork(after_in_child=_arenas_inherited)


# --- installing and removing ----------------------------------------------------------------

PATCHES = [
    (process.BaseProcess, "start", _process_start, "start"),
    (process.BaseProcess, "join", _process_join, "join"),
    (process.BaseProcess, "is_alive", _process_is_alive, "is_alive"),
    (process.BaseProcess, "_bootstrap", _process_bootstrap, "_bootstrap"),
    (threading.Thread, "_bootstrap_inner", _thread_bootstrap_inner, "_bootstrap_inner"),
    (util, "spawnv_passfds", _spawnv_passfds, "spawnv_passfds"),
    (spawn, "get_preparation_data", _get_preparation_data, "get_preparation_data"),
    (spawn, "prepare", _prepare, "prepare"),
    (reduction, "dump", _dump, "dump"),
]


def _patch(patches):
    for owner, attr, replacement, key in patches:
        store = _store_for(replacement)
        if key in store:                     # already installed
            continue
        if not hasattr(owner, attr):         # another Python: say_missing says so
            where = (owner.__name__ if isinstance(owner, type(sys)) else   # a module
                     f"{owner.__module__}.{owner.__qualname__}".removeprefix("builtins."))
            _skipped.append(f"{where}.{attr}")
            continue
        store[key] = owner.__dict__[attr] if attr in owner.__dict__ else getattr(owner, attr)
        setattr(owner, attr, replacement)
        _installed.append((owner, attr, store, key))


def _store_for(replacement):
    module = sys.modules[getattr(replacement, "__func__", replacement).__module__]
    return getattr(module, "_orig", _orig)


def threading_locks_on():
    return "threading.Lock" in locks._orig


def install(threading_locks=False):
    """Patch the stdlib for recording (idempotent). Stops a fork server that lacks the hooks.

    Blocking waits (a join, q.join, Event/Condition/Barrier waits, Pool results, futures, a feeder
    writing into a full pipe) are recorded by the wrappers in waits.py, installed with these."""
    fresh = "start" not in _orig
    _patch(PATCHES + messages.PATCHES + locks.PATCHES + waits.PATCHES)
    _hook_exit_function()
    messages.install_native()                # the per-message hooks in C, where they can be
    _install_heap()                          # sharedctypes (kept: each call checks ENABLED)
    frames.install()                         # our frames out of the tracebacks it prints
    if threading_locks:
        _patch(locks.THREADING_PATCHES)
    if fresh and not _booted:
        _restart_forkserver()


_said_missing = False
_skipped = []                            # hooks whose target this Python lacks: "module.Class.attr"


def say_missing(directory):
    """What this Python's internals keep from the recorder (internals.py), as notes of the trace
    in `directory` (each process may add them: a trace shows each line once) and, the first
    time in this process, as a RecorderWarning."""
    global _said_missing
    from . import internals
    version = ".".join(map(str, sys.version_info[:3]))
    checked = internals.missing()
    lines = checked + [
        f"what mpviz records through {where} (this Python {version} does not have it)"
        for where in dict.fromkeys(_skipped) if not _named_in(where, checked)]
    for line in lines:
        recorder.note(directory, line)
    if lines and not _said_missing:
        import warnings
        _said_missing = True
        warnings.warn(recorder.RecorderWarning(
            "mpviz.trace: " + "; ".join(f"NOT RECORDED: {line}" for line in lines)), stacklevel=4)


def _named_in(where, lines):
    """True when one of internals.py's lines already names the hook target `where`
    ("multiprocessing.spawn.prepare" in "... multiprocessing.spawn.get_preparation_data and
    prepare ..."): a missing internal is said once, with what it keeps from the recorder."""
    owner, _, attr = where.rpartition(".")
    for line in lines:
        names = {word.strip("(),").rpartition(".")[2] for word in line.split()}
        if owner + "." in line and attr in names:
            return True
    return False


def uninstall():
    """Put the stdlib back as it was (not in a booted child: its hooks stay for good)."""
    if _booted:
        return
    frames.uninstall()
    while _installed:
        owner, attr, store, key = _installed.pop()
        setattr(owner, attr, store.pop(key))


def _restart_forkserver():
    try:
        from multiprocessing import forkserver
    except ImportError:
        return
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or pid == _hooked_forkserver or not hasattr(server, "_stop"):
        return
    if any(getattr(p._popen, "method", None) == "forkserver" for p in process.active_children()):
        import warnings
        warnings.warn(recorder.RecorderWarning(
            "mpviz.trace: a fork server started before recording still has live children; "
            "processes it forks now are not recorded. Join them before record() to fix this."),
            stacklevel=4)
        return
    server._stop()                           # started without our hooks: the next is fresh


def mark_booted(role=None):
    global _booted, _role
    _booted, _role = True, role
