"""Reading per-process logs back, incrementally, while their writers may still be running.

On an event's tour this comes after recorder.py (the file format: there, above ``encode``) and
before trace.py (whose ``Trace`` makes Events of what ``poll`` returns, and merges them by time).

A ``LogReader`` remembers, per file, the offset of the first record it has not yet returned;
``poll()`` lists the directory (new processes add new files), reads each file from its offset up
to the first length word that is still 0, and returns the new events. A live widget can call it
many times a second: each costs the new bytes, plus a small read and ``kill(pid, 0)`` per live log.

What can be wrong with a log, and what we do (never crash, always say what was skipped):

    the directory is missing            FileNotFoundError with the path (a clear error)
    no logs in it                       an empty result and a warning
    header: wrong magic or too short    that file is skipped, with a warning
    header: a newer format version      that file is skipped, with a warning naming the versions
    header: magic but no chunk size     read again at the next poll (a writer mid-way); at the
      or pid (not yet complete)         final read that file is skipped, with a warning
    a damaged record (length too large, the reader looks for the next record whose checksum holds
      wrong checksum, does not decode,  and reads on from there, with a warning that says how
      or a length of 0 with records     many bytes it skipped (``skipped_bytes``); with none after
      after it, at the final read)      it, the rest of the file is skipped with a warning if the
                                        writer is dead (final read), read again at the next poll
                                        if not
"""
import errno
import os
import re
import struct
import warnings
import zlib

from .recorder import (FORMAT_VERSION, HEADER, HEADER_SIZE, LENGTH, MAGIC, PAD, RECORD,
                       SUFFIX, decode)

READ_WINDOW = 1 << 16
_ZEROS = re.compile(rb"\0*")       # a record starts with a non-zero length word: skip zeros
                                   # (10x faster than searching for [^\0]: a thousand logs
                                   # each end in most of a megabyte of zeros)


class TraceFormatWarning(UserWarning):
    """Raised (as a warning) when part of a trace directory cannot be read and is skipped."""


class _FileState:
    __slots__ = ("path", "pid", "ppid", "chunk", "off", "bad", "torn_at", "skipped", "done",
                 "waits")

    def __init__(self, path):
        self.path, self.pid, self.ppid, self.chunk = path, None, None, None
        self.off = HEADER_SIZE
        self.bad = False       # unreadable header: skipped for good
        self.torn_at = None    # offset of a record that did not decode (may still be in flight)
        self.skipped = 0       # bytes of damaged records skipped over, to a good record
        self.done = False      # read to its end after its writer died: nothing more will come
        self.waits = _Waits()  # its threads' open waits: a get's wait ends at its queue.get


class LogReader:
    """Incremental reader of all the logs in one trace directory.

    A record counts only when its length fits its chunk, its body's Adler-32 matches the stored
    checksum, and the body decodes. A writer copies the length word last, so a record that is not
    complete has length 0 and is simply "not there yet"; the checksum catches the rest -- a file
    damaged afterwards, or a read that raced a copy (then the record is read again at the next
    poll)."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        self.files = {}        # file name -> _FileState
        self.problems = []     # what was skipped, in words (also issued as warnings)

    @property
    def skipped_bytes(self):
        """How many bytes of damaged records were skipped, in all files, to reach good ones."""
        return sum(st.skipped for st in self.files.values())

    def poll(self, final=False):
        """Return the events (tuples ts_ns, pid, tid, kind, args) written since the last poll.

        With `final=True` the writers are taken to be finished: a torn record is reported.
        """
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(
                f"trace directory {self.directory!r} does not exist (or is not a directory); "
                f"pass the DIR that record(path=DIR) or `python -m mpviz trace -o DIR` wrote")
        out = []
        for name in sorted(os.listdir(self.directory)):
            if not name.endswith(SUFFIX):
                continue
            st = self.files.get(name)
            if st is None:
                st = self.files[name] = _FileState(os.path.join(self.directory, name))
            if not st.bad and (final or not st.done):
                self._read_file(st, out, final)
        if final and not self.files:
            self._problem(f"trace directory {self.directory!r} holds no *{SUFFIX} logs: "
                          f"nothing was recorded there")
        return out

    def _problem(self, text):
        if text not in self.problems:
            self.problems.append(text)
            warnings.warn(TraceFormatWarning(text), stacklevel=4)

    def _read_header(self, st, fd, final):
        raw = os.pread(fd, HEADER.size, 0)
        if len(raw) < HEADER.size:
            if len(raw) == 0:
                return False            # just created; its writer has not written yet
            st.bad = True
            self._problem(f"{st.path}: only {len(raw)} bytes, not a complete log header; skipped")
            return False
        magic, version, hsize, chunk, pid, ppid, _t0 = HEADER.unpack(raw)
        if magic != MAGIC:
            if magic == b"\0" * 8:
                return False            # header not written yet
            st.bad = True
            self._problem(f"{st.path}: not an mpviz log (magic {magic!r}); skipped")
            return False
        if chunk == 0 or hsize < HEADER.size or pid == 0:
            # The magic but not the rest. Our writer stores the magic last, so this is a header
            # from a writer that stored it first (older mpviz, same format) caught mid-way,
            # or a damaged one: read it again at the next poll; at the last, skip it.
            if final:
                st.bad = True
                self._problem(f"{st.path}: its header was never completed (chunk size {chunk}, "
                              f"header size {hsize}); skipped")
            return False
        if version > FORMAT_VERSION:
            st.bad = True
            self._problem(f"{st.path}: written in log format {version}, this mpviz reads up to "
                          f"{FORMAT_VERSION}; skipped -- upgrade mpviz to read it")
            return False
        st.pid, st.ppid, st.chunk, st.off = pid, ppid, chunk, hsize
        return True

    def _read_file(self, st, out, final):
        try:
            fd = os.open(st.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if st.pid is None and not self._read_header(st, fd, final):
                return
            # Whether the writer is gone is asked *before* reading: then all it wrote is read
            # now, and later polls (a live view, the hang watchdog: ten a second) can skip this
            # log -- a program that ran a thousand short children leaves a thousand such logs.
            gone = not final and not _alive(st.pid)
            self._read_records(st, fd, out, final)
            st.done = gone and st.torn_at is None and not st.bad
        finally:
            os.close(fd)

    def _read_records(self, st, fd, out, final):
        size = os.fstat(fd).st_size
        chunk, pid = st.chunk, st.pid
        buf, buf_off = b"", st.off
        native_read = _native_reader()
        while st.off < size:
            room = chunk - st.off % chunk           # bytes left in this chunk
            if room < LENGTH.size:
                st.off += room
                continue
            rel = st.off - buf_off
            if rel + RECORD.size > len(buf):         # refill the window from here
                buf_off = st.off
                buf = os.pread(fd, min(READ_WINDOW, room), st.off)
                rel = 0
                if len(buf) < LENGTH.size:
                    break
            (n,) = LENGTH.unpack_from(buf, rel)
            if n == PAD:
                st.off += room
                continue
            what = None
            if n == 0:
                if not final or not self._resync(st, fd, size, "a record length of 0"):
                    break                            # the end, for now (or for good)
                buf = b""
                continue
            if native_read is not None and rel + RECORD.size + n <= len(buf):
                # the records that pass every check, up to the window's end, read in C; the
                # first it cannot take (if any) comes to the loop below as it is
                after = native_read(buf, rel, pid, out, st.waits.add, _WAIT_KINDS)
                if after > rel:
                    st.off += after - rel
                    st.torn_at = None
                    continue
            if RECORD.size + n > room:
                what = f"a record length of {n} bytes runs past its chunk"
            else:
                if rel + RECORD.size + n > len(buf):     # not all of it in the window
                    buf_off = st.off
                    buf = os.pread(fd, min(max(READ_WINDOW, RECORD.size + n), room), st.off)
                    rel = 0
                event = None if RECORD.size + n > len(buf) else _check_and_decode(buf, rel, n)
                if RECORD.size + n > len(buf):
                    what = "the file ends inside a record"
                elif event is None:
                    what = "a record whose checksum does not match, or that does not decode"
                else:
                    ts, tid, kind, args = event
                    if kind in _WAIT_KINDS:              # (see _Waits)
                        st.waits.add(out, ts, pid, tid, kind, args)
                    else:
                        out.append((ts, pid, tid, kind, args))
                    st.off += RECORD.size + n
                    st.torn_at = None
                    continue
            if not self._resync(st, fd, size, what):
                self._torn(st, final, what)
                return
            buf = b""

    def _resync(self, st, fd, size, what):
        """Move st.off past damage to the next good record; say so. False if there is none."""
        good = _next_good_record(fd, st.off + 1, size, st.chunk)
        if good is None:
            return False
        skipped = good - st.off
        st.skipped += skipped
        self._problem(f"{st.path}: {what} at offset {st.off} (a damaged record); skipped "
                      f"{skipped} bytes to the next record whose checksum holds, at offset "
                      f"{good}, and read on from there")
        st.off, st.torn_at = good, None
        return True

    def _torn(self, st, final, what):
        # While the writer runs this may be a record being written: retry at the next poll.
        st.torn_at = st.off
        if final:
            st.bad = True
            self._problem(f"{st.path}: {what} at offset {st.off} (a process killed while "
                          f"writing, or a damaged file) and no good record after it; the rest "
                          f"of this log is skipped")


_WAIT_KINDS = frozenset(("wait.begin", "wait.end", "queue.get", "pipe.recv"))


class _Waits:
    """A get's wait ends at its own ``queue.get``: the reader writes the ``wait.end`` it stands for.
    (A Pipe's recv's wait, likewise, at the thread's next ``pipe.recv``: waits._recv_wait.)

    A Queue's get that finds nothing to read yet is recorded as a wait (waits.py). Such a wait
    ends when the get has read its message -- and the read is recorded anyway, as ``queue.get``
    (messages.py). So the recorder writes only ``wait.begin`` for it, and this class, per log,
    turns the thread's next ``queue.get`` on the same queue into the wait's end too::

        written by the recorder                          what poll() returns
        wait.begin {on: "queue.get", id: Q}              wait.begin {on: "queue.get", id: Q}
        queue.get {queue: Q, ...}    (same thread)       queue.get {queue: Q, ...}
                                                         wait.end {on: "queue.get", id: Q, ok: True}
                                                              (at the queue.get's time)

    A get that ends without a read -- a timeout ran out (``Empty``), an exception, a message
    that came with no event -- still gets its own ``wait.end`` from the recorder: it is passed
    through. A process killed inside the wait wrote neither: its ``wait.begin`` stays open, and
    the thread is drawn as still waiting, as a hang should be. And a ``wait.end`` for a wait this
    class has already ended (a trace written before the recorder left it out, or a writer that
    could not tell) is dropped, so that no wait ends twice.

    It follows each thread's open waits as a stack, the innermost last: only a get's wait that
    is the thread's innermost is ended by a ``queue.get`` (the recorder records no wait inside a
    wait, so it always is)."""
    __slots__ = ("open", "ended")

    def __init__(self):
        self.open = {}         # tid -> [(on, id) of each wait.begin not yet ended], innermost last
        self.ended = {}        # tid -> Q: its get's wait on Q was ended by its queue.get (above)

    def add(self, out, ts, pid, tid, kind, args):
        out.append((ts, pid, tid, kind, args))
        if kind == "queue.get":
            stack = self.open.get(tid)
            q = args.get("queue")
            if stack and stack[-1] == ("queue.get", q):
                stack.pop()
                self.ended[tid] = q
                out.append((ts, pid, tid, "wait.end", {"on": "queue.get", "id": q, "ok": True}))
        elif kind == "pipe.recv":       # a Pipe's recv: its wait (on its own end) ends here
            stack = self.open.get(tid)
            if stack and stack[-1][0] == "pipe.recv":
                on, end = stack.pop()
                self.ended[tid] = end
                out.append((ts, pid, tid, "wait.end", {"on": on, "id": end, "ok": True}))
        elif kind == "wait.begin":
            self.open.setdefault(tid, []).append((args.get("on"), args.get("id")))
            self.ended.pop(tid, None)
        else:                                           # wait.end
            on, wid = args.get("on"), args.get("id")
            if on in ("queue.get", "pipe.recv") and self.ended.get(tid, _NONE) == wid:
                del self.ended[tid]
                out.pop()                               # ended already: see above
                return
            stack = self.open.get(tid)
            if stack:
                stack.pop()


_NONE = object()


def _alive(pid):
    """Might process `pid` still write? (A zombie, or a reused pid, says yes: reading once
    more costs little; saying no too early would lose events.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True                  # someone else's: it exists
    return True


def _native_reader():
    """writer.c's read_records where the C Writer loads (native.py), else None: then the loop
    in ``_read_records`` reads every record itself (``MPVIZ_PURE_PYTHON=1`` asks for that too:
    both readers read the same events, tests/test_trace_writer.py checks)."""
    if os.environ.get("MPVIZ_PURE_PYTHON", "") not in ("", "0"):
        return None
    if not _native:
        from . import native
        _native.append(getattr(native.load(), "read_records", None))
    return _native[0]


_native = []                       # [read_records or None], once _native_reader has looked


def _check_and_decode(buf, rel, n):
    """The event in the record of length `n` at buf[rel:], or None if it fails its checks."""
    _, check = RECORD.unpack_from(buf, rel)
    body = buf[rel + RECORD.size:rel + RECORD.size + n]
    if zlib.adler32(body) != check:
        return None
    try:
        return decode(body)
    except (ValueError, EOFError, TypeError, struct.error):
        return None


def _seek(fd, start, size, data):
    """Where the data (`data` True) or the hole (False) at or after `start` begins. A log's
    chunk is a sparse file's hole until written, a hole reads as zeros, and no record starts or
    ends in one: so a thousand logs' last chunks need not be read. Where the system cannot tell
    (no SEEK_DATA), the answer that reads everything: `start` for data, `size` for a hole."""
    whence = getattr(os, "SEEK_DATA" if data else "SEEK_HOLE", None)
    if whence is None:
        return start if data else size
    try:
        return min(size, max(start, os.lseek(fd, start, whence)))
    except OSError as exc:
        if exc.errno == errno.ENXIO:                # no data after `start`
            return size
        return start if data else size


def _next_good_record(fd, start, size, chunk):
    """The offset of the first record at or after `start` that passes every check, or None.

    Searched chunk by chunk (a record never straddles two); in each, every byte offset whose
    length word is not 0 is tried.

    Records are appended one at a time (under a lock, or the GIL in the C Writer), each complete
    before the next begins, and a record's length is written last: a record being written has
    length 0. So a record that fails its checks with a good record *after* it is damage (a flipped
    byte, a bad disk), never a write in progress, and one damaged record costs only itself.
    Resynchronising is possible because a record carries its own checksum: at each byte offset after
    the damage, read a length, and see whether the bytes it covers match the checksum and decode. A
    false match needs a random 32-bit checksum to match and the bytes to decode as an event.
    """
    while start < size:
        base = _seek(fd, start, size, data=True)
        if base >= size:
            break
        chunk_end = min((base // chunk + 1) * chunk, size)
        start = min(chunk_end, _seek(fd, base, size, data=False))   # where to go on from
        data = os.pread(fd, start - base, base)
        if data == bytes(len(data)):                # all zeros (the end of a log's reserve):
            continue                                # nothing to try (a C compare, not a scan)
        pos = 0
        while pos + RECORD.size <= len(data):
            nonzero = _ZEROS.match(data, pos).end()
            if nonzero == len(data):
                break
            pos = max(pos, nonzero - LENGTH.size + 1)           # the first word holding it
            (n,) = LENGTH.unpack_from(data, pos)
            if n != 0 and n != PAD and pos + RECORD.size + n <= len(data) \
                    and _check_and_decode(data, pos, n) is not None:
                return base + pos
            pos += 1
    return None
