"""The recorder's hot path: one append-only, crash-safe log per process.

Call sites check ``recorder.ENABLED`` (always ``writer is not None``; both change in
``_set_writer`` only) before building an event, so recording off costs one attribute read::

    if recorder.ENABLED:
        recorder.emit("shm.create", name=name, strategy="file_system", nbytes=n)
    w = recorder.writer                     # a hot call site: straight to the Writer
    if w is not None:
        w.emit("queue.get", {"queue": qid, "nbytes": n})

Every recording process owns one log file ``<pid>-<n>.mpvlog``, *memory-mapped*: the Writer
encodes an event (``encode``: the bytes of one record) and copies it into the mapping, no system
call. The pages are the kernel's page cache, so what was copied is "in the file" even if the
process dies by SIGKILL. ``Writer`` below is the reference; ``writer.c`` writes the same bytes in C
(native.py loads it where it builds; else, or with ``MPVIZ_PURE_PYTHON=1``, this one records)::

    emit(kind, **args) -> writer.emit(kind, args)      (mark() calls writer.mark directly)
        encode -> append: fits below `end`? copy, the length word last; else on_full() maps more
        anything fails: on_error() -- a warning and a record.dropped event, or, if the log
        itself failed (OSError), a warning and recording stops

Which kinds there are, and their args: ``events.KINDS``. Next on an event's tour: reader.py reads
the records back (``decode``), and trace.py merges every process's into a ``Trace``.
"""
import marshal
import mmap
import os
import struct
import sys
import threading
import time
import warnings
import zlib
from _thread import allocate_lock, get_ident

FORMAT_VERSION = 2
MAGIC = b"MPVZLOG\0"
HEADER = struct.Struct("<8sHHIIIQ")  # magic, version, header size, chunk, pid, ppid, t0
HEADER_SIZE = 64
CHUNK = 1 << 20
RESERVE = 16 << 10                   # the first part of a chunk reserved on disk (then doubled)
MAX_RECORD = CHUNK - HEADER_SIZE     # a record must fit in a chunk, the first one included
LENGTH = struct.Struct("<I")         # a record's first word: n, or 0 (the end), or PAD
RECORD = struct.Struct("<II")        # n, adler32(body)
BODY = struct.Struct("<QQB")         # ts_ns, tid, k; then the kind (k bytes) and the args
_pack_length = LENGTH.pack_into
PAD = 0xFFFFFFFF
SUFFIX = ".mpvlog"

ENABLED = False          # the one thing call sites read
writer = None            # the Writer of this process's log while recording (a faster emit)
PID = None               # this process's pid while recording (os.getpid() is a system call)
_log = None              # the open _Log of this process, or None
_tids = {}               # threading.get_ident() -> OS thread id
_forking = None          # the _Log whose lock is held across os.fork()
_fork_hooks_installed = False


class RecorderWarning(UserWarning):
    """Raised (as a warning) when recording cannot start or had to stop; the program goes on."""


# --- one record: encode (the writers), decode (the reader) --------------------------------
#
# File layout (format version 2)::
#
#     offset 0     header, 64 bytes: b"MPVZLOG\0", u16 version, u16 header size, u32 chunk size,
#                  u32 pid, u32 parent pid, u64 monotonic_ns at open, (zero padding); the magic
#                  is written last, as a record's length word is
#     offset 64    record, record, record, ...                  (all numbers little endian)
#
#     record       u32 n | u32 check | u64 ts_ns | u64 tid | u8 k | kind | args
#                                    '------------- body: n bytes ----------------'
#                  check = zlib.adler32(body), kind = k bytes of UTF-8,
#                  args  = marshal.dumps(args_dict, 2)
#     n = 0        end of the data written so far (the file is pre-zeroed)
#     n = ~0       padding: the rest of this chunk is unused, continue at the next chunk
#
# The checksum and body are copied first and the length word last, so a reader -- or a process
# killed in the middle of a copy -- finds either the whole record or none (n still 0). The
# checksum catches what is left: a file damaged afterwards, a reader whose read raced a copy (see
# reader.py). Adapted from LevelDB's log format (a length and a checksum per record); left out:
# records split across blocks, and its CRC32C -- Adler-32 takes a few lines of C, and
# ``zlib.adler32`` in Python.
#
# Ordering: events carry ``time.monotonic_ns()``, a single system-wide clock on Linux, so the logs
# of all processes merge by sorting. ``tid`` is the OS thread id (``threading.get_native_id``),
# cached per thread because asking the kernel costs a system call.

def encode(ts, tid, kind, args):
    """One event as a record: ``RECORD`` (n, checksum) + body. writer.c writes the same bytes."""
    kind_bytes = kind.encode()
    if len(kind_bytes) > 255:
        raise ValueError(f"event kind {kind!r} is longer than 255 bytes")
    body = BODY.pack(ts, tid, len(kind_bytes)) + kind_bytes + marshal.dumps(args, 2)
    return RECORD.pack(len(body), zlib.adler32(body)) + body


def sig(buf):
    """A fingerprint of a message's bytes, to check a write/read pair (messages.py): Adler-32 of
    the last 32 (the log's own checksum; writer.c computes the same)."""
    return zlib.adler32(buf[-32:])


def decode(body):
    """A record's body (its checksum already checked) -> (ts_ns, tid, kind, args)."""
    ts, tid, k = BODY.unpack_from(body)
    start = BODY.size + k
    return ts, tid, str(body[BODY.size:start], "utf-8"), marshal.loads(body[start:])


# --- the Writer: appending records to a mapped chunk --------------------------------------

class Writer:
    """Appends events to a log's mapped chunk: the pure-Python reference (writer.c: the same in C).

    Records go below `end`, the part of the chunk reserved on disk. `on_full()` is called when
    a record does not fit: it reserves more of the chunk (``use(mm, pos, end)``) or, when the
    record cannot fit in this chunk at all (a PAD word was written), maps the next chunk
    (``use(mm, 0, end)``); it returns True (False: the log is closed, the event is dropped).
    `on_error(kind, exc)` is told about any failure; ``emit`` raises only what `on_error`
    raises (the recorder's logs say so and stop recording; a SideLog raises).
    """

    def __init__(self, on_full, on_error, max_record):
        self.on_full, self.on_error, self.max_record = on_full, on_error, max_record
        self.lock = allocate_lock()     # one append at a time (the C Writer holds the GIL)
        self.mm, self.pos, self.end, self.sealed = None, 0, 0, True

    def use(self, mm, pos, end=None):
        """Append to chunk `mm` from offset `pos` on, below `end` (default: the whole chunk);
        None: stop appending."""
        # Called only while sealed (no append reads mm/pos then) or to stop: no lock needed.
        self.sealed = True
        if mm is not None:
            end = len(mm) if end is None else end
            if not 0 <= pos <= end <= len(mm):
                raise ValueError("use(): pos or end outside the chunk")
        self.mm, self.pos, self.end = mm, pos, end
        self.sealed = mm is None

    def emit(self, kind, args):
        self.emit_at(time.monotonic_ns(), kind, args)

    def mark(self, name, args):
        """A user's mark: ``emit("mark", {"name": name, **args})`` (the C Writer skips the dict)."""
        self.emit_at(time.monotonic_ns(), "mark", {"name": name, **args})

    def queue_event(self, ts, kind, queue, msg, data):
        """A Queue message's event, {queue, msg, nbytes, sig} for its bytes `data`."""
        try:
            args = {"queue": queue, "msg": msg, "nbytes": len(data), "sig": sig(data)}
        except Exception as exc:       # not bytes: told, as any failure to record is
            self.on_error(kind, exc)
            return
        self.emit_at(ts, kind, args)

    def emit_at(self, ts, kind, args):
        try:
            record = encode(ts, _tids.get(get_ident()) or _learn_tid(), kind, args)
            n = len(record)
            if n > self.max_record:
                raise ValueError(f"event of {n} bytes is larger than a log chunk "
                                 f"(at most {self.max_record} bytes)")
            while True:
                with self.lock:
                    if not self.sealed:
                        mm, pos = self.mm, self.pos
                        if pos + n <= self.end:
                            mm[pos + 4:pos + n] = record[4:]    # checksum and body first ...
                            mm[pos:pos + 4] = record[:4]        # ... then the length commits it
                            self.pos = pos + n
                            return
                        if pos + n > len(mm) and self.end - pos >= 4:
                            _pack_length(mm, pos, PAD)          # full: the rest is unused
                        self.sealed = True
                if not self.on_full():                 # reserves more, or the next chunk
                    return                                      # recording stopped: dropped
        except Exception as exc:       # a recorder must never break the program it observes
            self.on_error(kind, exc)


def _learn_tid():
    tid = _tids[get_ident()] = threading.get_native_id()
    return tid


def forget_thread():
    """Called when a thread ends: its ident may be reused by a new thread with another tid."""
    _tids.pop(get_ident(), None)


def writer_class():
    """The C Writer if it can be built and loaded (see native.py), else the Python one."""
    if os.environ.get("MPVIZ_PURE_PYTHON", "") not in ("", "0"):
        return Writer
    from . import native         # (lazily: writer.c is built, once, when recording starts)
    module = native.load()
    if module is None:
        return Writer
    _connect(module)
    return module.Writer


def _connect(module):
    """writer.c's hooks keep a copy of ``writer`` (reading this module's global would cost them a
    lookup per message): give them the current one, and from now on _set_writer tells them."""
    global _tell_c
    if _tell_c is None:
        _tell_c = module.set_writer        # first: a change from now on is told
        module.set_writer(writer)


def writer_name():
    """Which Writer records this process: "C" or "Python" (None when not recording)."""
    w = writer
    return None if w is None else "Python" if isinstance(w, Writer) else "C"


# --- the log file: header, chunks, and its Writer -----------------------------------------

class _Log:
    """One process's memory-mapped log file; its Writer appends, this class maps the chunks.

    The file grows in chunks of ``CHUNK`` bytes, and a chunk is reserved on disk as it fills:
    the file is extended to the chunk's end with ``ftruncate`` (a sparse file: a hole costs no
    disk), and the part records go into is reserved with ``posix_fallocate`` -- ``RESERVE``
    bytes at first, twice as much each time it is full -- so a full disk is an error we can
    report here, never a SIGBUS while writing into the mapping. A log's disk usage
    (``st_blocks``) thus follows its events: 16 KiB for a process that recorded a few, not a
    whole chunk. A record never straddles two chunks.
    """

    def __init__(self, directory, ppid, on_error):
        self.lock = allocate_lock()     # taken to map a new chunk, to close, across a fork
        self.directory = os.path.abspath(directory)     # (the program may chdir)
        self.on_error = on_error
        pid = os.getpid()
        for n in range(1000):   # a reused pid, or a second record() in this process
            self.path = os.path.join(directory, f"{pid}-{n}{SUFFIX}")
            try:
                # 0600: a log holds argv and what the program marked; O_EXCL never follows a
                # link another user planted, nor reuses a file that is not ours
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                  0o600)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free log name for pid {pid} in {directory}")
        self.mm, self.writer = None, None
        self.mm_fd = None        # the fd number the mapping holds (see _close_mapping)
        self.base = 0            # file offset of the mapped chunk
        self.end = 0             # how much of it is reserved on disk (records go below)
        self.identity = None     # (st_dev, st_ino) of the log: is self.fd still it?
        try:
            self._map_chunk(0)
            # The magic goes in last, as a record's length word does: a reader polling now sees
            # "not written yet" (zeros) until every other field of the header is there.
            HEADER.pack_into(self.mm, 0, bytes(len(MAGIC)), FORMAT_VERSION, HEADER_SIZE, CHUNK,
                             pid, ppid or 0, time.monotonic_ns())
            self.mm[0:len(MAGIC)] = MAGIC
        except BaseException:
            self.close()
            raise
        self.writer = writer_class()(self._next_chunk, self._write_failed, MAX_RECORD)
        self.writer.use(self.mm, HEADER_SIZE, self.end)

    @property
    def off(self):
        """File offset of the next record."""
        return self.base + self.writer.pos

    def _check_fd(self):
        """The log's fd must still be the log: a program may close it (``os.closerange``) or
        put another file in its place (``os.dup2``), and growing *that* would write into the
        program's file. Raises OSError (recording stops, saying why) instead."""
        try:
            st = os.fstat(self.fd)
        except OSError as exc:
            raise OSError(exc.errno, f"the program closed the recorder's log fd {self.fd} "
                                     f"(os.closerange?); events up to here are kept") from None
        if (st.st_dev, st.st_ino) != self.identity:
            raise OSError(f"the program put another file on the recorder's log fd {self.fd} "
                          f"(os.dup2?); events up to here are kept")

    def _map_chunk(self, base):
        if self.identity is None:
            st = os.fstat(self.fd)
            self.identity = (st.st_dev, st.st_ino)
        self._check_fd()
        os.ftruncate(self.fd, base + CHUNK)            # a hole: no disk used yet
        old_fd = self.mm_fd
        self.mm, self.base, self.end = _map(self.fd, base), base, 0
        self.mm_fd = self._find_mapping_fd(old_fd)
        self._reserve(RESERVE)

    # Python's mmap keeps a dup() of the fd it maps (until 3.13's trackfd=False), and closes
    # that number when the mapping is closed. A program that closed our fds may own that number
    # by then: _close_mapping gives it back its file.

    def _find_mapping_fd(self, old):
        """The fd number the new mapping holds (a second fd on our log), or None if unknown."""
        if _TRACKS_FD:
            return None                                   # (3.13: the mapping holds none)
        try:
            fds = [int(n) for n in os.listdir("/proc/self/fd")]
        except OSError:
            return None                                   # not Linux: left unprotected
        found = [fd for fd in fds if fd not in (self.fd, old) and self._is_log(fd)]
        return found[0] if len(found) == 1 else None

    def _is_log(self, fd):
        try:
            st = os.fstat(fd)
        except OSError:
            return False
        return self.identity in (None, (st.st_dev, st.st_ino))   # (None: not looked at yet)

    def _close_mapping(self, mm, mm_fd):
        """``mm.close()``, but if the number of the fd it holds now names a file of the program
        (it closed ours and opened one, or dup2'd one there), that file stays open there."""
        if mm_fd is None or self._is_log(mm_fd):
            mm.close()
            return
        try:
            saved = os.dup(mm_fd)              # the program's file at that number, if any
        except OSError:
            mm.close()                         # nothing there: the close finds nothing
            return
        inheritable = os.get_inheritable(mm_fd)
        try:
            mm.close()
        finally:
            os.dup2(saved, mm_fd, inheritable=inheritable)
            os.close(saved)

    def _reserve(self, end):
        """Reserve the chunk's bytes up to `end` on disk: ENOSPC here, not SIGBUS later."""
        end = min(end, CHUNK)
        self._check_fd()
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(self.fd, self.base + self.end, end - self.end)
        self.end = end

    def _next_chunk(self):
        """The Writer's on_full: reserve more of this chunk, or (when the Writer padded it)
        map the next one. False when the log is closed."""
        with self.lock:
            if self.mm is None:
                return False
            w = self.writer
            if w.sealed:                 # (else another thread got here first)
                pos = w.pos
                padded = pos + 4 <= self.end and LENGTH.unpack_from(self.mm, pos)[0] == PAD
                if self.end < CHUNK and not padded:
                    self._reserve(2 * self.end)
                    w.use(self.mm, pos, self.end)
                else:
                    full, full_fd = self.mm, self.mm_fd
                    self._map_chunk(self.base + CHUNK)
                    w.use(self.mm, 0, self.end)      # lets go of the full chunk ...
                    self._close_mapping(full, full_fd)   # ... so that it can be unmapped
            return True

    def _write_failed(self, kind, exc):
        self.on_error(self, kind, exc)

    def abandon(self):
        """Forget this log without touching it (in a forked child: it is the parent's)."""
        self._close()

    def close(self):
        with self.lock:
            self._close()

    def _close(self):
        if self.mm is not None:
            if self.writer is not None:
                self.writer.use(None, 0)
            self._close_mapping(self.mm, self.mm_fd)
            self.mm = self.mm_fd = None
        if self.fd is not None:
            # Still our log? A program that closed it (``os.closerange``) may have opened a
            # file of its own that got the same number, or put one there (``os.dup2``):
            # closing that would take the program's file from it (and the next log opened
            # here would get its number, and the program would write into the trace).
            if self._is_log(self.fd):
                os.close(self.fd)
            self.fd = None


def _map(fd, base):
    """CHUNK bytes of the file `fd` from `base`, shared and writable."""
    if _TRACKS_FD:
        return mmap.mmap(fd, CHUNK, offset=base, trackfd=False)   # (3.13: no fd of its own)
    return mmap.mmap(fd, CHUNK, offset=base)


_TRACKS_FD = sys.version_info >= (3, 13)


def _raise(log, kind, exc):
    raise exc


class SideLog:
    """A log of its own in `directory`, for an observer that writes events about *other*
    processes (a scenario's watchdog), without starting recording in this process."""

    def __init__(self, directory, name):
        self._log = _Log(directory, os.getppid(), on_error=_raise)
        self.emit("process.start", how=name, ppid=os.getppid(), name=name, argv=[name])

    def emit(self, kind, **args):
        self._log.writer.emit(kind, args)

    def close(self):
        self._log.close()


# --- recording in this process --------------------------------------------------------------

def emit(kind, **args):
    """Record one event of `kind` with JSON-able `args` (a no-op when not recording)."""
    w = writer
    if w is not None:
        w.emit(kind, args)


# --- what a message carried: its handles, counted by the side that pickles it -------------------
#
# The reducers (mpviz.multiprocessing.reductions, mpviz.cuda) call count_handle() for each
# shared-memory or CUDA handle they pickle; whoever pickles a message takes the count right
# after (take_handles) and records it on the message's put-side event (``handles=N``). So a
# picture knows what a message carried from its sender, not from what happened around it.

_packing = threading.local()


def count_handle():
    """One more handle pickled in this thread (called by the reducers while recording)."""
    _packing.handles = getattr(_packing, "handles", 0) + 1


def take_handles():
    """The handles pickled in this thread since the last call; the count starts again at 0."""
    n = getattr(_packing, "handles", 0)
    if n:
        _packing.handles = 0
    return n


def emit_at(ts_ns, kind, **args):
    """Record an event with a timestamp taken earlier (e.g. before a call that may block)."""
    w = writer
    if w is not None:
        w.emit_at(ts_ns, kind, args)


def _recording_failed(log, kind, exc):
    """The Writers' on_error. Two kinds of failure, two answers:

    * the log itself failed (an ``OSError``: disk full, directory gone; or anything raised while
      the Writer waited for its next chunk, sealed): nothing more can be written, so recording
      stops, with one warning;
    * this one event could not be encoded (an argument marshal cannot write, an event larger
      than a chunk): that event alone is dropped, with a warning, and a small ``record.dropped``
      event takes its place in the log, so that the trace shows where something is missing.
      Recording goes on.
    """
    if log is not _log:
        return
    if isinstance(exc, OSError) or log.writer.sealed:   # sealed: it failed mapping a chunk
        _fail(f"recording stopped in pid {os.getpid()} at a {kind!r} event ({exc!r})")
        return
    reason = _shorten(f"{type(exc).__name__}: {exc}", 200)
    warnings.warn(RecorderWarning(
        f"mpviz.trace: a {_shorten(repr(kind), 60)} event was not recorded ({reason}); "
        f"recording goes on. Fix: "
        f"give events only str/int/float/bool/None and lists or dicts of them, and less than "
        f"{MAX_RECORD // 1024} KiB in all (record a summary, such as a shape or a length, not "
        f"the data)."), stacklevel=4)
    if kind != "record.dropped":      # (that one always encodes; never loop)
        log.writer.emit("record.dropped", {"kind": _shorten(str(kind), 255), "error": reason})


def _shorten(text, most):
    """`text`, its middle cut out if longer than `most` (an error's end often says why)."""
    if len(text) <= most:
        return text
    half = (most - 3) // 2
    return text[:half] + "..." + text[-half:]


def _set_writer(w):
    """Every change of `writer` goes through here, and ``ENABLED`` follows it; writer.c's hooks
    are told too, once connected (see _connect)."""
    global writer, ENABLED
    writer, ENABLED = w, w is not None
    if _tell_c is not None:
        _tell_c(w)


_tell_c = None           # writer.c's set_writer, once _connect has connected it


def _fail(message):
    global _log
    _set_writer(None)
    log, _log = _log, None
    warnings.warn(RecorderWarning(f"mpviz.trace: {message}. The program goes on unrecorded."),
                  stacklevel=4)
    if log is not None:
        note(log.directory, f"{message}; what it did afterwards is not in the trace")
        try:
            log.close()
        except OSError:
            pass


# --- notes: what could not be recorded, in words, beside the logs ------------------------------
#
# A process whose log failed cannot say so in its log. It appends one line to NOTES in the trace
# directory instead (opened by name, so a closed or replaced log fd does not matter); readers
# show these lines with the trace (``Trace.notes``, the launcher's report, ``viz.summary``).

NOTES = "notes.txt"


def note(directory, text):
    """Append the line `text` to the trace directory's NOTES file; never raises."""
    line = " ".join(str(text).split()) + "\n"           # one line, whatever it held
    try:
        fd = os.open(os.path.join(directory, NOTES),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line.encode("utf-8", "replace"))    # O_APPEND: lines do not interleave
    except OSError:
        pass
    finally:
        os.close(fd)


RENDEZVOUS = ".rendezvous"   # a trace directory's flag: some process began a rendezvous


def flag_rendezvous():
    """Say in the trace directory, once per process, that this process entered a
    torch.distributed (or mpviz.distributed) rendezvous: the hang watchdog reads the logs for
    a rendezvous that waits for ranks that never come only where this flag is (a program with
    no rendezvous, a 10,000-batch DataLoader, is not read again for it). Never raises."""
    global _flagged
    directory = current_directory()
    if directory is None or _flagged == directory:
        return
    _flagged = directory
    try:
        os.close(os.open(os.path.join(directory, RENDEZVOUS),
                         os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass


_flagged = None


def create_private(directory, name):
    """Create the file `name` in the trace `directory` for writing, private (0600), never
    through a link and never over an existing file: a link another user planted would make us
    overwrite what it points to, and a file already there is not ours to replace. When `name`
    is taken, the first free ``stem-2.ext``, ``stem-3.ext``... is used. Returns (binary file,
    its path): the caller says where it wrote when the name is not the one asked for."""
    stem, ext = os.path.splitext(name)
    for n in range(1, 1000):
        path = os.path.join(directory, name if n == 1 else f"{stem}-{n}{ext}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), path
    raise FileExistsError(f"{directory} holds {name} and 998 more of its kind: give -o a new "
                          f"directory")


def read_notes(directory):
    """The lines of the trace directory's NOTES file ([] when there is none)."""
    try:
        with open(os.path.join(directory, NOTES), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return []


def start(directory, how, ppid=None, **info):
    """Start recording this process into `directory` (created if missing).

    Returns True when recording; on failure warns (``RecorderWarning``) and returns False, so
    that the caller's program runs unrecorded. Emits ``process.start`` with `how` and `info`.
    """
    global PID, _log
    stop()
    _install_fork_hooks()
    ppid = ppid if ppid is not None else os.getppid()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        log = _Log(directory, ppid, on_error=_recording_failed)
    except OSError as exc:
        warnings.warn(RecorderWarning(
            f"mpviz.trace: cannot record into {directory!r}: {exc}. The program runs "
            f"unrecorded; pass a writable directory (record(path=...) or -o DIR)."), stacklevel=3)
        return False
    _tids.clear()
    PID = os.getpid()
    _log = log
    _set_writer(log.writer)
    import multiprocessing
    emit("process.start", how=how, ppid=ppid, name=multiprocessing.current_process().name,
         argv=list(sys.argv), **info)
    return True


def stop():
    """Stop recording in this process and close its log (what was written stays)."""
    global _log
    log, _log = _log, None
    _set_writer(None)
    if log is not None:
        log.close()


def current_directory():
    """The trace directory this process records into, or None."""
    log = _log
    return log.directory if log is not None else None


# Forks: a forked child must not append to its parent's file, so ``os.register_at_fork`` gives
# the child a fresh log in the same directory (and holds the log's lock across the fork, so the
# child never inherits a half-mapped chunk). Failures (disk full, directory gone) disable the
# recorder with one warning: the user's program keeps running, unrecorded.

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
    global _log, _forking
    parent_log, _forking = _forking, None
    if parent_log is None:
        return
    _log = None
    _set_writer(None)
    parent_log.abandon()
    parent = parent_log.path.rsplit(os.sep, 1)[-1].split("-")[0]
    start(parent_log.directory, "fork", ppid=int(parent))
