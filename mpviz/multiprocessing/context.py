"""Start-method contexts whose Queue, Process and Pool are mpviz's.

The stdlib hands out its objects through *contexts*: ``multiprocessing.get_context("spawn")``
returns an object whose ``Queue()``, ``Process``, ``Pool()`` … use the spawn start method. mpviz
subclasses each concrete context so that those factories return mpviz's classes:

* ``Queue`` / ``JoinableQueue`` pickle in ``put`` (:mod:`mpviz.multiprocessing.queues`);
* a child ``Process`` starts with its parent's sharing settings (strategy, shm manager on/off);
* ``Process.start()`` and ``Pool``'s submit methods check that a spawned child could import
  the function it is given, and that the main script has its main guard
  (:mod:`mpviz.multiprocessing.checks`) — the stdlib would crash or hang later instead.

The *default* context shares its state with the stdlib's: ``mpviz.multiprocessing
.set_start_method("spawn")`` is ``multiprocessing.set_start_method("spawn")``, as in torch, whose
``torch.multiprocessing`` simply re-exports the stdlib.
"""
import collections.abc
import multiprocessing
import multiprocessing.context as _std
import multiprocessing.pool
import numbers
import os

from .. import sharing
from . import _pipe, checks, queues, synchronize


class _ProcessChecks:
    """Mixin for Process classes: refuse, before starting, a child that would crash on arrival.

    The stdlib checks little at the call: ``Process(target=f, args=5)`` fails inside
    ``tuple(args)``, ``args="ab"`` silently passes two arguments ``'a', 'b'``, a target that is
    not callable dies in the child, and its misuse errors (start twice, join before start) are
    bare ``assert`` statements. Each is refused here with what, why and a fix.
    """

    _start_method = None  # None: whatever the default context says at start()

    def __init__(self, group=None, target=None, name=None, args=(), kwargs=None, *, daemon=None):
        if group is not None:
            raise ValueError(f"group must be None (multiprocessing keeps it only to look like "
                             f"threading.Thread), not {group!r}. Fix: leave group out.")
        if target is not None and not callable(target):
            raise TypeError(f"target must be a function to run in the child, not "
                            f"{type(target).__name__} {target!r}. Fix: Process(target=f, "
                            f"args=(x,)) — pass the function itself, not f(x), which calls it here.")
        checks.check_args(args, "args", "Process(target=f, args=(x,))")
        if kwargs is not None and not isinstance(kwargs, collections.abc.Mapping):
            raise TypeError(f"kwargs must be a dict of keyword arguments for the target, not "
                            f"{type(kwargs).__name__} {kwargs!r}. Fix: kwargs={{'name': value}}.")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str (it names the process in errors and traces), "
                            f"not {type(name).__name__} {name!r}. Fix: name='worker-1'.")
        super().__init__(group, target, name, tuple(args), {} if kwargs is None else kwargs,
                         daemon=daemon)

    def start(self):
        self._check_can_start()
        method = self._start_method or multiprocessing.get_start_method()
        checks.check_function(getattr(self, "_target", None), method, "target")
        checks.check_main_guard(method, stack_depth=2)
        self._mpviz_settings = sharing.settings()
        super().start()

    def _check_can_start(self):
        # The stdlib's own checks, as errors instead of bare asserts.
        if self._closed:
            raise ValueError(f"{self.name} was closed (Process.close()), so it cannot start. "
                             f"Fix: create a new Process.")
        if self._popen is not None:
            raise RuntimeError(
                f"{self.name} was already started (pid {self.pid}): a Process object runs its "
                f"target once, in one child, and cannot start again. Fix: create a new "
                f"Process(target=...) for each run.")
        if self._parent_pid != os.getpid():
            raise RuntimeError(
                f"{self.name} was created by process {self._parent_pid}, not by this one "
                f"({os.getpid()}); only the process that created a Process object can start it "
                f"(it alone can wait for the child). Fix: create the Process where you start it.")
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                f"{multiprocessing.current_process().name} is a daemonic process (a Pool worker, "
                f"or a Process(daemon=True)), and daemonic processes may not start children: "
                f"when it is stopped, its children would be left behind, orphaned. Fix: start "
                f"the processes from the main process, or make this one with daemon=False.")

    def join(self, timeout=None):
        if self._popen is None and not self._closed:
            raise RuntimeError(f"{self.name} was never started, so there is nothing to join. "
                               f"Fix: call start() before join().")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real)):
            raise TypeError(f"timeout must be a number of seconds or None, not "
                            f"{type(timeout).__name__} {timeout!r}. Fix: join(timeout=5).")
        return super().join(timeout)

    def _bootstrap(self, *args, **kwargs):
        # In the child, before the target runs: share the way the parent did.
        settings = getattr(self, "_mpviz_settings", None)
        if settings is not None:
            sharing.apply_settings(settings)
        return super()._bootstrap(*args, **kwargs)


class Process(_ProcessChecks, _std.Process):
    """``multiprocessing.Process`` (default start method) with mpviz's start checks."""


class PendingTasksWarning(UserWarning):
    """Warned when a ``with Pool(...)`` block ends while submitted tasks are still running."""


class Pool(multiprocessing.pool.Pool):
    """``multiprocessing.Pool`` that refuses, at submit time, functions its workers can't import,
    and that does not throw away tasks still running when its ``with`` block ends.

    The stdlib Pool hangs on such a function instead: its workers die unpickling the task and the
    result never comes (see :mod:`mpviz.multiprocessing.checks`). And the stdlib's
    ``Pool.__exit__`` calls ``terminate()``: tasks submitted with ``apply_async``/``map_async``
    whose results nobody waited for are killed, and their callbacks never run — silently. The
    tutorial in our sources expects them to finish ("Got result: 3"), and so does mpviz: it waits
    for them (``close(); join()``) and warns that the stdlib would not have.
    """

    def __init__(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None, context=None):
        self._state = multiprocessing.pool.INIT   # what Pool.__del__ reads if we refuse below
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)):
            raise TypeError(f"processes must be an int (how many worker processes) or None (one "
                            f"per CPU), not {type(processes).__name__} {processes!r}. "
                            f"Fix: Pool(2), or Pool(int(value)) for a number read as text.")
        if processes is not None and processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}: a Pool with no "
                             f"worker would never run a task. Fix: Pool(1) or more.")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be a function that each worker calls once, not "
                            f"{type(initializer).__name__} {initializer!r}. Fix: "
                            f"Pool(2, initializer=setup, initargs=(x,)).")
        checks.check_args(initargs, "initargs", "Pool(2, initializer=setup, initargs=(x,))")
        self._mpviz_method = (context or multiprocessing).get_start_method()
        checks.check_function(initializer, self._mpviz_method, "Pool initializer")
        checks.check_main_guard(self._mpviz_method, stack_depth=3)
        super().__init__(processes, initializer, initargs, maxtasksperchild, context)

    def apply_async(self, func, args=(), kwds={}, callback=None, error_callback=None):
        checks.check_function(func, self._mpviz_method, "function given to apply")
        checks.check_args(args, "args", "pool.apply_async(f, args=(x,))")
        return super().apply_async(func, args, kwds, callback, error_callback)

    def _map_async(self, func, iterable, mapper, chunksize=None, callback=None, error_callback=None):
        checks.check_function(func, self._mpviz_method, "function given to map")
        return super()._map_async(func, iterable, mapper, chunksize, callback, error_callback)

    def imap(self, func, iterable, chunksize=1):
        checks.check_function(func, self._mpviz_method, "function given to imap")
        return super().imap(func, iterable, chunksize)

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is None and self._cache:
            import warnings
            warnings.warn(PendingTasksWarning(
                f"{len(self._cache)} task(s) submitted to this Pool were still running when its "
                f"'with' block ended; mpviz waits for them. (The stdlib's Pool.__exit__ would "
                f"terminate() them and their results and callbacks would be lost: call .get() "
                f"on each result, or pool.close(); pool.join() before leaving the block.)"),
                stacklevel=2)
            self.close()
            self.join()
        else:
            self.terminate()

    def imap_unordered(self, func, iterable, chunksize=1):
        checks.check_function(func, self._mpviz_method, "function given to imap_unordered")
        return super().imap_unordered(func, iterable, chunksize)


class _ContextMixin:
    """The factories mpviz replaces; everything else is the stdlib context's."""

    def Queue(self, maxsize=0):
        return queues.Queue(maxsize, ctx=self.get_context())

    def JoinableQueue(self, maxsize=0):
        return queues.JoinableQueue(maxsize, ctx=self.get_context())

    def Pool(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None):
        return Pool(processes, initializer, initargs, maxtasksperchild, context=self.get_context())

    def Pipe(self, duplex=True):
        return _pipe.Pipe(duplex)

    def Event(self):
        return synchronize.Event(ctx=self.get_context())

    def get_context(self, method=None):
        if method is None:
            return self
        try:
            return _concrete[method]
        except KeyError:
            raise ValueError(f"cannot find context for {method!r}: it is not a start method "
                             f"this platform has, {sorted(_concrete)}. Fix: get_context('spawn') "
                             f"(the safe choice), 'forkserver' or 'fork'.") from None


_concrete = {}


def _make(name, std_context, std_process):
    process = type(std_process.__name__, (_ProcessChecks, std_process),
                   {"_start_method": name, "__module__": __name__,
                    "__doc__": f"``{std_process.__name__}`` with mpviz's start checks."})
    context = type(type(std_context).__name__, (_ContextMixin, type(std_context)),
                   {"Process": process, "__module__": __name__})
    _concrete[name] = context()
    return process


for _name in multiprocessing.get_all_start_methods():
    _std_ctx = multiprocessing.get_context(_name)
    globals()[_std_ctx.Process.__name__] = _make(_name, _std_ctx, _std_ctx.Process)


class DefaultContext(_ContextMixin, _std.BaseContext):
    """The default context: its start method *is* the stdlib's (one setting for both)."""

    Process = Process

    def get_context(self, method=None):
        if method is None:
            return _concrete[multiprocessing.get_start_method()]
        return super().get_context(method)

    def get_start_method(self, allow_none=False):
        return multiprocessing.get_start_method(allow_none)

    def set_start_method(self, method, force=False):
        multiprocessing.set_start_method(method, force)

    def get_all_start_methods(self):
        return multiprocessing.get_all_start_methods()


default_context = DefaultContext()
