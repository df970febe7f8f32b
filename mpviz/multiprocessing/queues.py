"""Queues that pickle in ``put``, so tensors are shared before ``put`` returns.

The stdlib ``multiprocessing.Queue.put`` only appends the object to a list; a *feeder thread*
pickles it later and writes it to a pipe::

    stdlib:   put(t) ─▶ buffer ─▶ [feeder thread] pickle(t) ─▶ pipe ─▶ get()
                 │
                 └─ returns at once: t.is_shared() is still False, and a pickling error is
                    printed by the feeder thread — your code never sees it (a lost message).

    mpviz:    put(t) ─▶ pickle(t) here ─┬─▶ pipe ─────────────────────────▶ get()
                           │            │   (it fits, and nothing waits before it)
                           │            └─▶ buffer ─▶ [feeder thread] ─▶ pipe
                           │                (the pipe is too full: keep the stdlib's behaviour)
                           └─ t is in shared memory now; errors are raised to the caller.

**Writing straight into the pipe.** Handing a message to the feeder thread costs two thread
switches (wake the feeder, which then competes for the GIL) — most of a small message's trip. So
``put`` writes the bytes itself when three things are true, and otherwise buffers them exactly as
the stdlib does:

1. nothing of ours is still waiting for the feeder (``_pending == 0``): a message must not
   overtake an earlier one from the same process;
2. no other process is writing to the pipe right now (the queue's cross-process write lock,
   taken without waiting);
3. the pipe has room for the whole message, so the write cannot block: the bytes already in it
   (``ioctl(FIONREAD)``) plus ours fit in its capacity (``fcntl(F_GETPIPE_SZ)``, 64 KiB) with
   two pages to spare (a pipe stores data in page-sized slots, and the slot being read is not
   fully reusable).

So a large item (bigger than the pipe) still goes through the feeder thread, and still makes the
lesson of "queue-join-deadlock": a process waits at exit until its feeder has written it all.

The pickled bytes that take the feeder's road travel inside a tiny :class:`_Pickled` wrapper
(the feeder pickles every object it sends; a wrapper of bytes costs it one copy) and ``get``
unwraps on arrival. Bytes written directly are just what :func:`_encode` made.

**What travels.** A lone plain tensor — the usual thing to put — travels as its *short
handle*: ``b"T"`` and a flat tuple of numbers and strings (which memory, which view of it),
written with ``marshal`` (see ``reductions.pack_tensor``). Anything else is pickled, with
:class:`_HandlePickler`, which is ``ForkingPickler`` without its per-call cost:
``ForkingPickler.dumps`` copies the whole ``copyreg`` dispatch table into every new pickler
(~6 µs of a ~20 µs put, measured with cProfile in issue #8); a class-level ``ChainMap`` over the
same two tables sees the same reducers, including ones registered later. Why not pickle the
lone tensor too: counted with valgrind, pickling and unpickling its handle took ~68,000
instructions, the short handle ~41,000 with everything around it (the receive cache, the
counts, the fd offer); a round trip of a shared tensor went from ~120 µs to ~75 µs.

**What else differs.** A ``put`` whose object fails to pickle half-way gives back the handles it
already made (``reductions.dumps_or_give_back``). Each put tells the handles it makes which pipe
carries them (``self._channel``, the pipe's inode), for the shm manager. ``close()`` closes this
process's ends of the pipe at once where no feeder thread was ever started (the stdlib leaves
them to the feeder, and without one to the garbage collector), and a call after ``close()``
raises :class:`QueueClosedError`, which names the call and why.

**Reading.** ``get`` is a copy of the stdlib's: the read lock, one read, a slot given back,
then — after the lock is released — :func:`_decode` (a short handle, or a pickle) where the
stdlib calls ``ForkingPickler.loads``. The read itself is ours too: the stdlib reads through ``Connection.recv_bytes`` (a length, then the bytes, each into an
``io.BytesIO`` in a Python loop: a few µs a message, a good part of a tensor handle's trip);
ours is two plain ``os.read`` calls of the same framing (``_read_message``), put in as the
queue's ``_recv_bytes``. The recorder wraps whichever read a queue has
(``messages.watch_reads``), so recording needs nothing else here.
"""
import array
import collections
import copyreg
import fcntl
import functools
import io
import marshal
import multiprocessing.queues
import os
import pickle
import struct
import sys
import termios
import time
from multiprocessing.reduction import ForkingPickler
from queue import Empty, Full

from ..trace import messages, recorder

# reductions.py (how a tensor travels) needs NumPy; it is imported by the first message, so that a
# spawned child that only passes numbers, or nothing, starts without it.
reductions = None


def _reductions():
    global reductions
    from . import reductions
    return reductions

_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", None)  # Linux only: elsewhere, always the feeder
_SLACK = 2 * 4096            # see point 3 above


class QueueClosedError(ValueError):
    """Raised when a Queue is used in a process after that process called its ``close()``.

    A ``ValueError``, as the stdlib's "Queue ... is closed" is, so ``except ValueError`` still
    catches it; it says which call it was and why that call cannot work any more.
    """

    _WHY = {
        "put": "close() said this process will put nothing more on it: its feeder thread has "
               "been told to write what is buffered and stop",
        "get": "close() closed this process's reading end of the queue's pipe: there is nothing "
               "left here to read from",
        "empty": "close() closed this process's reading end of the queue's pipe, which is what "
                 "empty() looks into",
    }

    def __init__(self, call, queue=""):
        self.call = call
        self.queue = queue
        why = self._WHY.get(call.split("_")[0], "close() released what it needs")
        super().__init__(
            f"Queue.{call}() on {queue or 'a Queue'} that this process has closed: {why}. "
            f"(Other processes that still have the queue can use it.) Fix: call close() only "
            f"once this process is done with the queue (usually just before it exits), or make "
            f"a new Queue.")

    def __reduce__(self):
        return (type(self), (self.call, self.queue))


class _Pickled:
    """An object already pickled by ``put``; unpickles to the original object in ``get``."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce__(self):
        return (_decode, (self.data,))


class _HandlePickler(pickle.Pickler):
    """Pickles exactly as ForkingPickler does (its reducers first, then copyreg's)."""

    dispatch_table = collections.ChainMap(ForkingPickler._extra_reducers, copyreg.dispatch_table)


def _dumps(obj):
    buf = io.BytesIO()
    _HandlePickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


# -- what a message is: a lone tensor's short handle, or a pickle ---------------------------------
#
#     b"T" + marshal.dumps((offset, shape, strides, dtype, requires_grad, <storage handle>))
#     b"\x80..."  anything else: pickle (protocol 2 and up starts with the byte 0x80)

_TENSOR = b"T"
_MARSHAL_VERSION = 2  # 3 and up also mark repeated objects: a hash table per call, here for nothing


def _stepped(op, obj, **info):
    """A stepped run (mpviz.stepper): wait for the learner's "go" before `op`. A dict lookup
    when nothing is stepped: the gate module is loaded only in a stepped process."""
    gate = sys.modules.get("mpviz.stepper.gate")
    if gate is not None and gate.pause:
        gate.pause(op, obj, **info)

def _encode(obj, channel=None):
    """The bytes that carry `obj`: a plain tensor's handle, marshalled (see
    ``reductions.pack_tensor``), or the pickle of anything else — which, if it fails half-way,
    gives back the handles it made. `channel`: the inode of the pipe they will travel in."""
    red = reductions or _reductions()
    handle = red.pack_tensor(obj, channel)
    if handle is not None:
        return _TENSOR + marshal.dumps(handle, _MARSHAL_VERSION)
    return red.dumps_or_give_back(_dumps, obj, channel)


def _decode(data):
    """The object that :func:`_encode` made `data` of."""
    if data[:1] == _TENSOR:
        return (reductions or _reductions()).unpack_tensor(marshal.loads(data[1:]))
    return ForkingPickler.loads(data)


class Queue(multiprocessing.queues.Queue):
    """``multiprocessing.Queue`` whose ``put`` encodes (and so shares tensors) synchronously,
    and writes small messages straight into the pipe when that cannot block."""

    def _reset(self, after_fork=False):
        super()._reset(after_fork=after_fork)
        self._pending = 0            # messages in our buffer or being written by our feeder
        self._pipe_size = None       # the pipe's capacity, asked once
        self._queued = array.array("i", [0])
        # get reads through this (under its read lock): our plain os.read framing instead of
        # Connection.recv_bytes (see the module text). The recorder wraps it too.
        self._recv_bytes = functools.partial(_read_message, self._reader.fileno())
        # Which pipe this is (the same inode in every process that has it): a file_system handle
        # put here says so in its segment's header, for the shm manager (see reductions).
        self._channel = os.fstat(self._reader.fileno()).st_ino

    def _start_thread(self):
        # Count each message off when the feeder has written it (or failed to): until then a
        # direct write could overtake it.
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

    def put(self, obj, block=True, timeout=None):
        _stepped("queue.put", messages._queue_id(self), direct=True)
        data, msg = self._take_slot_and_encode(obj, block, timeout)
        with self._notempty:
            if not self._write_now(data, msg):
                self._feed(data, msg)

    def get(self, block=True, timeout=None):
        """A copy of the stdlib's get (Python 3.11), changed in two places: the recorder's read
        hook put in first, while recording (the recorder patches the stdlib's ``Queue.get`` to
        do that, and this copy does not go through it), and :func:`_decode` in place of
        ``ForkingPickler.loads`` at the end (a lone tensor arrives as a short handle)."""
        _stepped("queue.get", messages._queue_id(self))
        if recorder.ENABLED:
            messages.watch_reads(self)             # its events order the reads: see there
            if block and messages.get_would_wait(self):    # nothing to read yet: a wait
                return messages.waiting_get(Queue.get, self, block, timeout)
        if self._closed:
            raise QueueClosedError("get" if block else "get_nowait", repr(self))
        if block and timeout is None:
            with self._rlock:
                res = self._recv_bytes()
            self._sem.release()
        else:
            if block:
                deadline = time.monotonic() + timeout
            if not self._rlock.acquire(block, timeout):
                raise Empty
            try:
                if block:
                    timeout = deadline - time.monotonic()
                    if not self._poll(timeout):
                        raise Empty
                elif not self._poll():
                    raise Empty
                res = self._recv_bytes()
                self._sem.release()
            finally:
                self._rlock.release()
        # unpickle (or unmarshal) after having released the lock, as the stdlib does
        try:
            return _decode(res)
        except BaseException as exc:      # read, but not rebuilt (its sender exited, say)
            if recorder.ENABLED:
                messages.get_failed(self, exc)
            raise

    def close(self):
        """As the stdlib's: this process will put nothing more. Its feeder thread, if it has
        one, writes what is buffered and then closes this process's ends of the pipe. Where
        there is none (every put wrote the pipe itself, or there was no put), this closes them
        now, as the feeder would have: a queue closed in every process is then really gone,
        and the shm manager can tell that no handle left in it will ever be received."""
        super().close()
        if self._thread is None:
            self._reader.close()
            self._writer.close()

    def empty(self):
        if self._closed:
            raise QueueClosedError("empty", repr(self))
        return super().empty()

    def _take_slot_and_encode(self, obj, block, timeout):
        """A place in the queue (or Full), then the encoded bytes (the slot given back if the
        object can't be encoded), and while recording a message id to link the get to the put."""
        if self._closed:
            raise QueueClosedError("put" if block else "put_nowait", repr(self))
        if not (messages.take_slot(self, block, timeout) if recorder.ENABLED  # full: a wait
                else self._sem.acquire(block, timeout)):
            if recorder.ENABLED:
                messages.put_failed(messages._queue_id(self), None, Full())
            raise Full
        try:
            if recorder.ENABLED:
                recorder.take_handles()   # count this message's handles from 0 (see recorder)
            data = _encode(obj, self._channel)
        except BaseException as exc:      # it can't travel (a re-sent CUDA tensor, say)
            self._sem.release()
            if recorder.ENABLED:
                messages.put_failed(messages._queue_id(self), None, exc)
            raise
        return data, (messages.next_msg() if recorder.ENABLED else None)

    def _feed(self, data, msg=None):
        """Hand `data` to the feeder thread, as the stdlib's put does (the notempty lock held)."""
        if self._thread is None:
            self._start_thread()
        item = _Pickled(data)
        if msg is not None:                       # recording: tagged, or in an envelope
            item = messages.queue_put_buffered(self, msg, data, item)
        self._buffer.append(item)
        self._pending += 1
        self._notempty.notify()

    def _write_now(self, data, msg=None):
        """Write `data` into the pipe if that keeps the order and cannot block (notempty held)."""
        if self._pending:
            return False
        wlock = self._wlock
        if wlock is not None and not wlock.acquire(False):
            return False
        try:
            fd = self._writer.fileno()
            if not self._pipe_has_room(fd, _LENGTH.size + len(data)):
                return False
            if msg is None:
                _write_message(fd, data)
            else:
                ts = time.monotonic_ns()               # before the bytes can be read
                _write_message(fd, data)
                messages.queue_put_direct(self, msg, data, ts)  # see mpviz.trace.messages
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


# -- a message on the pipe, as multiprocessing.connection frames it -------------------------------
#
#     [4-byte big-endian length][the pickled bytes]      (length -1: an 8-byte length follows)

_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def _write_message(fd, data):
    """Write one framed message to the pipe `fd`: what ``Connection.send_bytes(data)`` writes.
    The caller checked that the pipe has room, so it cannot block, and one ``os.write`` writes
    it all (the loop is for the short write a pipe with room does not make)."""
    view = _LENGTH.pack(len(data)) + data
    while view:
        view = view[os.write(fd, view):]


def _read_message(fd):
    """Read one framed message from the pipe `fd`: what ``Connection.recv_bytes()`` returns."""
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    if size == -1:
        (size,) = _LONG_LENGTH.unpack(_read_exactly(fd, _LONG_LENGTH.size))
    return _read_exactly(fd, size)


_read_message.reads_one_message = True   # writer.c's Tap may read it itself (messages._plain_pipe)


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


class JoinableQueue(multiprocessing.queues.JoinableQueue, Queue):
    """``multiprocessing.JoinableQueue`` whose ``put`` encodes synchronously (and writes small
    messages straight into the pipe, like :class:`Queue`)."""

    def put(self, obj, block=True, timeout=None):
        _stepped("queue.put", messages._queue_id(self), direct=True)
        data, msg = self._take_slot_and_encode(obj, block, timeout)
        with self._notempty, self._cond:
            # Count the task before the consumer can see it: its task_done() must find it.
            self._unfinished_tasks.release()
            try:
                if not self._write_now(data, msg):
                    self._feed(data, msg)
            except BaseException:
                self._unfinished_tasks.acquire(False)
                raise
