"""The recorder's hot path: one append-only, crash-safe log per process.

Call sites check ``recorder.ENABLED`` before building an event, so that recording off costs one
attribute read (the observer pattern of trio's ``Instrument``)::

    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy="file_system", nbytes=n)

How an event reaches the disk
-----------------------------
Every process that records owns one log file ``<pid>-<n>.mpvlog`` in the trace directory. The file
is *memory-mapped*: ``emit`` encodes the event and copies it into the mapping, with no system call.
The pages belong to the kernel's page cache, so when the process dies -- even by SIGKILL, even by
``os._exit`` -- everything it had copied is already "in the file". There is nothing to flush.

File layout (format version 1)::

    offset 0     header, 64 bytes: b"MPVZLOG\\0", u16 version, u16 header size, u32 chunk size,
                 u32 pid, u32 parent pid, u64 monotonic_ns at open, (zero padding)
    offset 64    record, record, record, ...
    record       u32 length n (little endian) + n bytes of marshal.dumps((ts_ns, tid, kind, args), 2)
    length 0     end of the data written so far (the file is pre-zeroed)
    length ~0    padding: the rest of this chunk is unused, continue at the next chunk

The file grows in chunks of ``CHUNK`` bytes (reserved with ``posix_fallocate`` so a full disk is an
error we can report here, not a SIGBUS later). A record never straddles two chunks. The payload is
copied *before* its length word, so a process killed in the middle of ``emit`` leaves either no
record (length still 0) or a torn one that the reader detects and skips (see ``reader.py``).

Ordering: events carry ``time.monotonic_ns()``, a single system-wide clock on Linux, so the logs of
all processes merge by sorting. ``tid`` is the OS thread id (``threading.get_native_id``), cached
per Python thread because asking the kernel costs a system call.

Forks: a forked child must not append to its parent's file, so ``os.register_at_fork`` gives the
child a fresh log in the same directory (and holds the writer lock across the fork, so the child
never inherits a half-written record). Failures (disk full, directory gone) disable the recorder
with one warning: the user's program keeps running, unrecorded.
"""
import marshal
import mmap
import os
import struct
import sys
import threading
import time
import warnings
from _thread import allocate_lock, get_ident

FORMAT_VERSION = 1
MAGIC = b"MPVZLOG\0"
HEADER = struct.Struct("<8sHHIIIQ")  # magic, version, header size, chunk, pid, ppid, t0
HEADER_SIZE = 64
CHUNK = 1 << 20
LENGTH = struct.Struct("<I")
_pack_length = LENGTH.pack_into
PAD = 0xFFFFFFFF
SUFFIX = ".mpvlog"

ENABLED = False          # the one thing call sites read
PID = None               # this process's pid while recording (os.getpid() is a system call)
_log = None              # the open _Log of this process, or None
_tids = {}               # threading.get_ident() -> OS thread id
_forking = None          # the _Log whose lock is held across os.fork()
_fork_hooks_installed = False


class RecorderWarning(UserWarning):
    """Raised (as a warning) when recording cannot start or had to stop; the program goes on."""


class _Log:
    """One process's memory-mapped log file, written under a lock by all its threads."""

    def __init__(self, directory, ppid):
        self.lock = allocate_lock()
        self.directory = directory
        pid = os.getpid()
        for n in range(1000):   # a reused pid, or a second record() in this process
            self.path = os.path.join(directory, f"{pid}-{n}{SUFFIX}")
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free log name for pid {pid} in {directory}")
        self.mm = None
        self.base = 0            # file offset of the mapped chunk
        try:
            self._map_chunk(0)
            HEADER.pack_into(self.mm, 0, MAGIC, FORMAT_VERSION, HEADER_SIZE, CHUNK, pid,
                             ppid or 0, time.monotonic_ns())
        except BaseException:
            self.close()
            raise
        self.off = HEADER_SIZE   # file offset of the next record

    def _map_chunk(self, base):
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(self.fd, base, CHUNK)  # ENOSPC here, not SIGBUS later
        else:                                          # macOS
            os.ftruncate(self.fd, base + CHUNK)
        mm = mmap.mmap(self.fd, CHUNK, offset=base)
        if self.mm is not None:
            self.mm.close()
        self.mm, self.base = mm, base

    def write(self, rec):
        n = len(rec)
        with self.lock:
            off = self.off - self.base
            end = off + 4 + n
            if end > CHUNK:                      # does not fit: pad, then start a new chunk
                off, end = self._next_chunk(off, n)
            mm = self.mm
            mm[off + 4:end] = rec                # payload first ...
            _pack_length(mm, off, n)             # ... then the length commits it
            self.off = self.base + end

    def _next_chunk(self, off, n):
        if n + 4 > CHUNK - HEADER_SIZE:
            raise ValueError(f"event of {n} bytes is larger than a log chunk ({CHUNK} bytes)")
        if CHUNK - off >= 4:
            _pack_length(self.mm, off, PAD)
        self._map_chunk(self.base + CHUNK)
        return 0, 4 + n

    def abandon(self):
        """Forget this log without touching it (in a forked child: it is the parent's)."""
        try:
            self.mm.close()
        finally:
            os.close(self.fd)

    def close(self):
        if self.mm is not None:
            self.mm.close()
        os.close(self.fd)


def _learn_tid():
    tid = _tids[get_ident()] = threading.get_native_id()
    return tid


def emit(kind, **args):
    """Record one event of `kind` with JSON-able `args` (a no-op when not recording)."""
    if _log is not None:
        _write(time.monotonic_ns(), kind, args)


def emit_at(ts_ns, kind, **args):
    """Record an event with a timestamp taken earlier (e.g. before a call that may block)."""
    if _log is not None:
        _write(ts_ns, kind, args)


def _write(ts, kind, args, _dumps=marshal.dumps, _get=_tids.get):
    log = _log
    try:
        log.write(_dumps((ts, _get(get_ident()) or _learn_tid(), kind, args), 2))
    except Exception as exc:            # a recorder must never break the program it observes
        if log is not None and log is _log:
            _fail(f"recording stopped in pid {os.getpid()} at a {kind!r} event "
                  f"({exc!r}; args must be str/int/float/bool/None/list/dict)")


class SideLog:
    """A log of its own in `directory`, for an observer that writes events about *other*
    processes (a scenario's watchdog), without starting recording in this process."""

    def __init__(self, directory, name):
        self._log = _Log(directory, os.getppid())
        self.emit("process.start", how=name, ppid=os.getppid(), name=name, argv=[name])

    def emit(self, kind, **args):
        self._log.write(marshal.dumps((time.monotonic_ns(), threading.get_native_id(), kind, args), 2))

    def close(self):
        self._log.close()


def forget_thread():
    """Called when a thread ends: its ident may be reused by a new thread with another tid."""
    _tids.pop(get_ident(), None)


def _fail(message):
    global ENABLED, _log
    ENABLED, log, _log = False, _log, None
    warnings.warn(RecorderWarning(f"mpviz.trace: {message}. The program goes on unrecorded."),
                  stacklevel=3)
    if log is not None:
        try:
            log.close()
        except OSError:
            pass


def start(directory, how, ppid=None, **info):
    """Start recording this process into `directory` (created if missing).

    Returns True when recording; on failure warns (``RecorderWarning``) and returns False, so
    that the caller's program runs unrecorded. Emits ``process.start`` with `how` and `info`.
    """
    global ENABLED, PID, _log
    stop()
    _install_fork_hooks()
    ppid = ppid if ppid is not None else os.getppid()
    try:
        os.makedirs(directory, exist_ok=True)
        log = _Log(directory, ppid)
    except OSError as exc:
        warnings.warn(RecorderWarning(
            f"mpviz.trace: cannot record into {directory!r}: {exc}. The program runs "
            f"unrecorded; pass a writable directory (record(path=...) or -o DIR)."), stacklevel=3)
        return False
    _tids.clear()
    PID = os.getpid()
    _log, ENABLED = log, True
    import multiprocessing
    emit("process.start", how=how, ppid=ppid, name=multiprocessing.current_process().name,
         argv=list(sys.argv), **info)
    return True


def stop():
    """Stop recording in this process and close its log (what was written stays)."""
    global ENABLED, _log
    log, _log, ENABLED = _log, None, False
    if log is not None:
        with log.lock:
            log.close()


def current_directory():
    """The trace directory this process records into, or None."""
    log = _log
    return log.directory if log is not None else None


def _install_fork_hooks():
    global _fork_hooks_installed
    if not _fork_hooks_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork_child)
        _fork_hooks_installed = True


def _before_fork():
    global _forking
    _forking = _log
    if _forking is not None:
        _forking.lock.acquire()


def _after_fork_parent():
    global _forking
    if _forking is not None:
        _forking.lock.release()
    _forking = None


def _after_fork_child():
    global ENABLED, _log, _forking
    parent_log, _forking = _forking, None
    if parent_log is None:
        return
    _log, ENABLED = None, False
    parent_log.abandon()
    parent = parent_log.path.rsplit(os.sep, 1)[-1].split("-")[0]
    start(parent_log.directory, "fork", ppid=int(parent))
