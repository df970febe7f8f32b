"""A message on a queue's pipe: its framing, and writing it in without the feeder thread;
and ``Pipe()``, whose ``send`` says what a pickling error means.

**Framing.** A pipe is a stream of bytes; ``multiprocessing.connection`` cuts it into messages
by writing each one's length first::

    [4-byte big-endian length][the message's bytes]      (length -1: an 8-byte length follows)

:func:`write_message` and :func:`read_message` do what ``Connection.send_bytes`` and
``recv_bytes`` do, with plain ``os.write``/``os.read`` (the stdlib reads through an
``io.BytesIO`` in a Python loop). queue_hooks.c's ``Tap`` has a C copy of them.

**Writing straight in** (:class:`DirectWrite`, mixed into mpviz's Queue). Handing a message to
the feeder thread costs two thread switches (wake the feeder, which then competes for the GIL):
most of a small message's trip. So ``put`` writes the bytes itself when three things are true,
and otherwise hands them to the feeder exactly as the stdlib does:

1. nothing of ours is still waiting for the feeder (``_pending == 0``): a message must not
   overtake an earlier one from the same process;
2. no other process is writing to the pipe right now (the queue's cross-process write lock,
   taken without waiting);
3. the pipe has room for the whole message, so the write cannot block: the bytes already in it
   (``ioctl(FIONREAD)``) plus ours fit in its capacity (``fcntl(F_GETPIPE_SZ)``, 64 KiB) with
   two pages to spare (a pipe stores data in page-sized slots; the one being read is not
   fully reusable).
"""
import array
import fcntl
import os
import pickle
import struct
import termios
import time
from multiprocessing import connection, reduction

from .. import trace
from ..trace import recorder
from ._codec import raise_explained

# -- the framing ------------------------------------------------------------------------------

LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def write_message(fd, data):
    """Write one framed message to the pipe `fd`: what ``Connection.send_bytes(data)`` writes.
    Where the pipe has room (the caller checked), one ``os.write`` writes it all; the loop is
    for a pipe that takes it in parts."""
    if len(data) <= 0x7fffffff:
        view = LENGTH.pack(len(data)) + data
    else:
        view = LENGTH.pack(-1) + _LONG_LENGTH.pack(len(data)) + data
    while view:
        view = view[os.write(fd, view):]


def read_message(fd):
    """Read one framed message from the pipe `fd`: what ``Connection.recv_bytes()`` returns."""
    (size,) = LENGTH.unpack(_read_exactly(fd, LENGTH.size))
    if size == -1:
        (size,) = _LONG_LENGTH.unpack(_read_exactly(fd, _LONG_LENGTH.size))
    return _read_exactly(fd, size)


read_message.reads_one_message = True   # queue_hooks.c's Tap may do this read itself (see its Tap)


def _read_exactly(fd, n):
    data = os.read(fd, n)
    if len(data) == n:
        return data                      # the usual case: the whole message is in the pipe
    if not data:
        raise EOFError                   # the writing end is closed (as Connection says it)
    parts, have = [data], len(data)
    while have < n:                      # a big message still being written: wait for the rest
        chunk = os.read(fd, n - have)
        if not chunk:
            raise OSError("got end of file during message")
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts)


# -- writing straight into the pipe -----------------------------------------------------------

_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", None)  # Linux only: elsewhere, always the feeder
_SLACK = 2 * 4096            # two pages to spare: see point 3 above


class DirectWrite:
    """What mpviz's Queue adds to the stdlib's to write a message itself (see the top).

    A message bigger than the pipe still goes through the feeder thread (and still teaches the
    "queue-join-deadlock": a process waits at exit until its feeder has written it all)."""

    def _reset(self, after_fork=False):
        super()._reset(after_fork=after_fork)
        self._pending = 0            # messages in our buffer or being written by our feeder
        self._pipe_size = None       # the pipe's capacity, asked once
        self._queued = array.array("i", [0])

    def _start_thread(self):
        # Count each message off when the feeder has written it (or failed to): until then a
        # direct write could overtake it. (The queue's _feed counts it on.)
        send = self._send_bytes

        def send_and_count(buf):
            try:
                send(buf)
            finally:
                with self._notempty:
                    self._pending -= 1
        self._send_bytes = send_and_count
        try:
            super()._start_thread()
        finally:
            self._send_bytes = send

    def _write_now(self, data):
        """Write `data` into the pipe if that keeps the order and cannot block; False: it
        was not written. (Called with the queue's notempty lock held, as the feeder's buffer
        is: so no message of ours can join the buffer meanwhile.)"""
        if self._pending:
            return False
        wlock = self._wlock
        if wlock is not None and not wlock.acquire(False):
            return False
        try:
            fd = self._writer.fileno()
            if not self._pipe_has_room(fd, LENGTH.size + len(data)):
                return False
            if recorder.writer is None:
                write_message(fd, data)
            else:
                # recording: one queue.put for the put and its write, timed here, under the
                # write lock and before the bytes can be read (so it orders the queue's writes)
                ts = time.monotonic_ns()
                write_message(fd, data)
                trace.messages.put_written(self, ts, data)
            return True
        finally:
            if wlock is not None:
                wlock.release()

    def _pipe_has_room(self, fd, nbytes):
        if self._pipe_size is None:
            try:
                self._pipe_size = fcntl.fcntl(fd, _F_GETPIPE_SZ) if _F_GETPIPE_SZ else 0
            except OSError:             # not a pipe: always use the feeder
                self._pipe_size = 0
        if nbytes + _SLACK > self._pipe_size:
            return False
        fcntl.ioctl(fd, termios.FIONREAD, self._queued, True)
        return self._queued[0] + nbytes + _SLACK <= self._pipe_size


# -- Pipe -------------------------------------------------------------------------------------

class Connection(connection.Connection):
    """``multiprocessing``'s Connection (what ``Pipe()`` returns): ``send`` pickles the object;
    when pickle refuses it, the error (same type, pickle's words kept) also says what the object
    is and what to send instead. Everything else is the stdlib's."""

    def send(self, obj):
        try:
            return super().send(obj)
        except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as exc:
            raise_explained(exc, "send(obj)")
            raise


def Pipe(duplex=True):
    """``multiprocessing.Pipe(duplex)``: two connected Connections (see above)."""
    a, b = connection.Pipe(duplex)
    a.__class__ = b.__class__ = Connection           # (the same object, one more method)
    return a, b


# A Connection travels to a child as the stdlib's does (its fd duplicated), and stays ours there.
def _reduce_connection(conn):
    rebuild, args = connection.reduce_connection(conn)
    return _rebuild_connection, (rebuild, args)


def _rebuild_connection(rebuild, args):
    conn = rebuild(*args)
    conn.__class__ = Connection
    return conn


reduction.register(Connection, _reduce_connection)
