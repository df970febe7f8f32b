"""``spawn``: start N processes running ``fn(i, *args)``, and hear about it when one fails.

Joining processes one by one hides failures: if process 0 runs forever, the crash of process 3
goes unnoticed, and nobody stops the others. ``spawn`` watches them all at once::

    parent                                            children 0..N-1
    ------                                            ---------------
    error pipes e0..eN (one-way: child → parent)
    start P0..PN  ─────────────────────────────────▶  prctl(PR_SET_PDEATHSIG, SIGINT): die with
                                                      the parent
    join(): wait on every process's sentinel          fn(i, *args)
       and error pipe (a long traceback is read  ◀──  on an exception: write the traceback (text,
       while it is written: no deadlock)               UTF-8) to e_i, then exit(1)
       one exits with code != 0
       SIGTERM the others; after a grace period,
       SIGKILL those still alive
       raise ProcessRaisedException(traceback of i)   (nothing on e_i: the process was killed or
          or ProcessExitedException(exit code/signal)  exited on its own → ProcessExitedException)

Why a pipe, not torch's error file (a /tmp path the parent *unpickles*: another user who plants
a pickle there runs code as you): a pipe has no name, and the parent reads text, never a pickle.

Adapted from torch's ``torch/multiprocessing/spawn.py``: same signatures, messages and exception
fields. Added: mpviz checks, in the parent and before starting, that the children could import
``fn`` and that the main script has its main guard (see :mod:`mpviz.multiprocessing.checks`).
"""
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import warnings

from .. import _proc
from . import checks
from .context import _concrete

log = logging.getLogger(__name__)


class ProcessException(Exception):
    """Raised by ``ProcessContext.join`` when a process failed (base of the two below)."""

    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    @property
    def pid(self):
        return self.error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """Raised when a process's ``fn`` raised an exception; the message carries its traceback."""


class ProcessExitedException(ProcessException):
    """Raised when a process exited with a non-zero code or was killed by a signal.

    ``exit_code`` is the code, or ``-signum`` for a signal; ``signal_name`` is e.g. ``"SIGKILL"``
    (the kernel's OOM killer is the usual sender of that one) or None.
    """

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)


def _set_pdeathsig(sig):
    """Ask Linux to send `sig` to this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def _watch_parent(parent):
    """Under forkserver this process is the fork server's child, and PR_SET_PDEATHSIG follows
    the fork server, which can outlive the program (measured: a rank alive 10 s after its
    program was SIGKILLed). The parent's sentinel cannot tell either (forkserver's is a pipe the
    parent closes once it has sent the child its data). So a daemon thread holds a pidfd of the
    real parent (Linux 5.3: readable when that process ends) and sends this process the same
    SIGINT then. A parent already gone (its pid reused by a younger process) is caught by its
    start time, which must be before ours."""
    try:
        pidfd = os.pidfd_open(parent.pid)
    except ProcessLookupError:            # the parent is gone
        pidfd = None
    except (AttributeError, OSError):     # no pidfd here (not Linux, or a kernel before 5.3):
        return                            # nothing to watch it with, as in the stdlib
    # None from /proc: the parent is gone (or a zombie); where /proc says nothing of us either
    # (not Linux), the pidfd alone decides
    mine, theirs = _proc.start_time(os.getpid()), _proc.start_time(parent.pid)
    if pidfd is None or (mine is not None and (theirs is None or theirs > mine)):
        os.kill(os.getpid(), signal.SIGINT)
        return

    main = threading.main_thread().ident

    def watch():
        multiprocessing.connection.wait([pidfd])
        # To the main thread itself, and again while it lives: a SIGINT that lands just before
        # the main thread goes to sleep in a lock is noticed only when that wait times out
        # (CPython checks its signals when a wait is interrupted; measured: 1 run in ~5 slept on).
        for _ in range(50):
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.2)
    threading.Thread(target=watch, name="mpviz-parent-watch", daemon=True).start()


def _wrap(fn, i, args, error_pipe):
    """What each child runs: fn(i, *args), reporting an exception through its error pipe."""
    # A shell that starts a job in the background (`cmd &`) makes it ignore SIGINT, and children
    # inherit that; then the death signal below would do nothing. torch has this hole; we close it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _set_pdeathsig(signal.SIGINT)
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        return  # the parent died while we were starting, before the death signal was armed
    if parent is not None and parent.pid != os.getppid():
        _watch_parent(parent)   # forkserver: the death signal fires with the fork server, not it
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # SIGINT from the parent (it died, or is shutting us down): counts as success
    except Exception:
        import traceback
        try:
            error_pipe.send_bytes(traceback.format_exc().encode("utf-8", "replace"))
        except OSError:
            pass            # the parent is gone: nobody to tell
        sys.exit(1)


class ProcessContext:
    """The processes started by ``start_processes(..., join=False)``; ``join()`` watches them.

    `error_pipes`: for each process, the reading end of its error pipe (a ``Connection``)."""

    def __init__(self, processes, error_pipes):
        self.error_pipes = dict(enumerate(error_pipes))  # index -> not yet read, still open
        self.tracebacks = {}                              # index -> what its pipe said
        self.processes = processes
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self):
        return [int(p.pid) for p in self.processes]

    def join(self, timeout=None, grace_period=None):
        """Wait for the processes; return True when all exited cleanly, False on timeout.

        On the first failure, terminate the others (SIGTERM, then SIGKILL after `grace_period`
        seconds, 30 if None) and raise ProcessRaisedException or ProcessExitedException.
        """
        if not self.sentinels:
            return True
        ready = self._wait(timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            if not self.sentinels:
                self._close_pipes()
            return not self.sentinels

        self._terminate_all(grace_period)
        failed = self.processes[error_index]
        try:
            self._read(error_index)        # it has exited: all it wrote is in the pipe
            original_trace = self.tracebacks.get(error_index)
            if original_trace is None:
                code = failed.exitcode
                if code < 0:
                    name = _signal_name(-code)
                    raise ProcessExitedException(
                        f"process {error_index:d} terminated with signal {name}",
                        error_index, failed.pid, code, name)
                raise ProcessExitedException(
                    f"process {error_index:d} terminated with exit code {code:d}",
                    error_index, failed.pid, code)
            msg = f"\n\n-- Process {error_index:d} terminated with the following error:\n" + original_trace
            raise ProcessRaisedException(msg, error_index, failed.pid)
        finally:
            self._close_pipes()

    def _wait(self, timeout):
        """The sentinels of processes that ended within `timeout`; meanwhile, read the error
        pipes that have something (a child blocks writing a long traceback until we do)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pipes = {conn: i for i, conn in self.error_pipes.items()}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(list(self.sentinels) + list(pipes), left)
            for conn in ready:
                if conn in pipes:
                    self._read(pipes[conn])
            ended = [s for s in ready if s not in pipes]
            if ended or not ready:
                return ended

    def _read(self, index):
        """Read process `index`'s error pipe (its one message, or nothing), then close it."""
        conn = self.error_pipes.pop(index, None)
        if conn is None:
            return
        try:
            if conn.poll():
                self.tracebacks[index] = conn.recv_bytes().decode("utf-8", "replace")
        except (EOFError, OSError):
            pass                           # it wrote nothing (or was killed while writing)
        finally:
            conn.close()

    def _terminate_all(self, grace_period):
        alive = [p for p in self.processes if p.is_alive()]
        for p in alive:
            log.warning("Terminating process %s via signal SIGTERM", p.pid)
            p.terminate()
        deadline = time.monotonic() + (30 if grace_period is None else grace_period)
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.is_alive():
                log.warning("Unable to shutdown process %s via SIGTERM , forcefully exiting via SIGKILL", p.pid)
                p.kill()
            p.join()
        self.sentinels.clear()

    def _close_pipes(self):
        for conn in self.error_pipes.values():
            conn.close()
        self.error_pipes.clear()


class SpawnContext(ProcessContext):
    """The old name of ProcessContext (torch renamed it in 1.4)."""

    def __init__(self, processes, error_pipes):
        warnings.warn("SpawnContext is renamed to ProcessContext since 1.4 release.", FutureWarning, stacklevel=2)
        super().__init__(processes, error_pipes)


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"<Unknown signal {signum}>"


# Left out of torch's start_processes: its parallel start for forkserver (TORCH_MP_PARALLEL_START).
def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """Start `nprocs` processes running ``fn(i, *args)`` with `start_method`; see ``spawn``."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be an int (how many processes to start), not "
                        f"{type(nprocs).__name__} {nprocs!r}. Fix: nprocs=4.")
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, not {nprocs}. Fix: nprocs=4.")
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    checks.check_args(args, "args", "spawn(fn, args=(x,), nprocs=2), which runs fn(i, x)")
    if start_method not in _concrete:
        raise ValueError(
            f"start_method={start_method!r} is not a start method here; this platform has "
            f"{sorted(_concrete)}. Fix: start_method='spawn' (the default, and the safe one), "
            f"or 'forkserver'/'fork' with mpviz.multiprocessing.start_processes.")
    checks.check_function(fn, start_method, "function given to spawn")
    ctx = _concrete[start_method]
    error_pipes, processes = [], []
    try:
        for i in range(nprocs):
            reader, writer = multiprocessing.connection.Pipe(duplex=False)  # stdlib: not recorded
            error_pipes.append(reader)
            process = ctx.Process(target=_wrap, args=(fn, i, args, writer), daemon=daemon)
            try:
                process.start()
            finally:
                writer.close()   # the child has its own copy; ours would hide its exit
            processes.append(process)
    except BaseException:
        for p in processes:
            p.kill()
            p.join()
        for reader in error_pipes:
            reader.close()
        raise
    context = ProcessContext(processes, error_pipes)
    if not join:
        return context
    while not context.join():
        pass


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """Start `nprocs` processes running ``fn(i, *args)``; raise if any of them fails.

    With ``join=True`` (default) wait for all of them; with ``join=False`` return the
    :class:`ProcessContext`. A failure terminates the other processes and raises
    :class:`ProcessRaisedException` (with the child's traceback) or
    :class:`ProcessExitedException` (exit code or signal).
    """
    if start_method != "spawn":
        warnings.warn(
            f"This method only supports start_method=spawn (got: {start_method}).\n"
            f"To use a different start_method use:\n\t\t mpviz.multiprocessing.start_processes(...)",
            FutureWarning, stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, start_method)
