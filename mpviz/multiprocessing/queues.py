"""Queues that encode in ``put``, so a tensor is shared before ``put`` returns.

The stdlib ``multiprocessing.Queue.put`` only appends the object to a list; a *feeder thread*
pickles it later and writes it to a pipe::

    stdlib:   put(t) ─▶ buffer ─▶ [feeder thread] pickle(t) ─▶ pipe ─▶ get()
                 │
                 └─ returns at once: t.is_shared() is still False, and a pickling error is
                    printed by the feeder thread — your code never sees it (a lost message).

    mpviz:    put(t) ─▶ encode(t) here ─┬─▶ pipe ─────────────────────────▶ get(): decode
                           │            │   (small, and nothing of ours waits before it)
                           │            └─▶ buffer ─▶ [feeder thread] ─▶ pipe
                           │                (otherwise: the stdlib's way, bytes and all)
                           └─ t is in shared memory now; errors are raised to the caller.

Follow one tensor through put → get in ten files, step by step, under either strategy:
docs/TOUR.md, "put → get under file_descriptor" and "put → get under file_system". In short: this
file (the queue), ``_codec.py`` (the bytes of a message: a tensor's short handle, or a pickle),
``reductions.py`` (what the handle holds, and the tensor rebuilt from it), the storage and the
sharing strategy whose memory it names (``mpviz/sharing/``), and ``_pipe.py`` (the pipe's
framing, and writing a message in without the feeder thread when that cannot block).

Also unlike the stdlib: a call after ``close()`` raises :class:`QueueClosedError` (and see
``close``). While recording, the Queue records itself where each fact happens (see :class:`Queue`).
"""
import functools
import multiprocessing.queues
import os
import time
from queue import Empty, Full

from .. import _stops, trace
from ..trace import recorder
from ..trace.events import queue_id
from ._codec import Pickled, decode, encode, raise_explained
from ._pipe import DirectWrite, read_message


class QueueClosedError(ValueError):
    """Raised when a Queue is used in a process after that process called its ``close()``.

    A ``ValueError`` whose message says "... is closed", as the stdlib's "Queue ... is closed"
    does, so ``except ValueError`` and code that matches the stdlib's words still work; it also
    says which call it was and why that call cannot work any more.
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
            f"Queue.{call}(): {queue or 'the Queue'} is closed in this process: {why}. "
            f"(Other processes that still have the queue can use it.) Fix: call close() only "
            f"once this process is done with the queue (usually just before it exits), or make "
            f"a new Queue.")

    def __reduce__(self):
        return (type(self), (self.call, self.queue))


class QueueClosedEmptyError(QueueClosedError, OSError):
    """``empty()`` on a Queue closed in this process: also an ``OSError``, as the stdlib's
    "handle is closed" there is (its ``empty()`` polls the closed reading end), so code that
    catches it still does, as does CPython's own ``test_closed_queue_empty_exceptions`` (3.13:
    a queue used, then closed). Not raised where the answer is certain without the reading
    end: see ``Queue.empty``."""


# os.fork() calls this process has made (and one more in a forked child: what it inherited was
# made elsewhere): a queue made after the last of them, never pickled and never put to here, is
# in no other process and holds nothing (see Queue.empty).
_forks = 0


def _count_fork():
    global _forks
    _forks += 1


os.register_at_fork(after_in_parent=_count_fork, after_in_child=_count_fork)


def _stepped(op, queue, **info):
    """A stepped run (mpviz.stepper): wait for the learner's "go" before `op`. One attribute
    read when nothing is stepped: the stepper fills the slot ``_stops.pause`` (mpviz/_stops.py),
    and names the queue as it names any (``stepper.patches.object_id``)."""
    if _stops.pause:
        _stops.pause(op, queue, **info)


class Queue(DirectWrite, multiprocessing.queues.Queue):
    """``multiprocessing.Queue`` whose ``put`` encodes (and so shares tensors) synchronously,
    and writes small messages straight into the pipe when that cannot block (``_pipe.py``).

    While ``mpviz.trace`` records, each fact is written at its line behind one flag read
    (``if recorder.ENABLED:``), as ``mpviz/sharing/`` writes its own: a put that raises, a put
    handed to the feeder (``_parcel``), a get and its wait, a message read but not rebuilt, and
    in ``_pipe.py`` the direct write. What is more than an ``emit`` is a helper of
    mpviz/trace/messages.py, reached as ``trace.messages`` (loaded with the recorder's hooks).
    (The stdlib's Queue, whose code we cannot edit, is recorded by wrapping it: messages.py.)"""

    def _reset(self, after_fork=False):
        super()._reset(after_fork=after_fork)
        # get reads through this (under its read lock): plain os.read calls of the stdlib's
        # framing, in place of Connection.recv_bytes (see _pipe.py).
        self._recv_bytes = functools.partial(read_message, self._reader.fileno())
        # Which pipe this is (the same inode in every process that has it): a file_system handle
        # put here says so in its segment's header, for the shm manager (see reductions).
        self._channel = os.fstat(self._reader.fileno()).st_ino
        # Made in this process (not a forked child's copy, not one unpickled from its maker):
        # how many forks this process had made by then (see empty).
        made_here = not after_fork and self._opid == os.getpid()
        self._made_at_fork = _forks if made_here else None
        self._put_here = False

    def __reduce_ex__(self, protocol):
        reduced = super().__reduce_ex__(protocol)   # (raises unless a child is being started)
        self._made_at_fork = None                   # another process will have it
        return reduced

    def put(self, obj, block=True, timeout=None):
        _stepped("queue.put", self, direct=True)
        try:
            self._enter(self._take_slot_and_encode(obj, block, timeout))
        except BaseException as exc:
            if recorder.ENABLED:                # it never entered the queue: queue.put_failed
                trace.messages.put_failed(queue_id(self), None, exc)
            raise

    def _enter(self, data):
        """The encoded message into the queue: into the pipe now if it fits, else to the
        feeder thread (JoinableQueue also counts it as a task)."""
        with self._notempty:
            if not self._write_now(data):
                self._feed(data)

    def _take_slot_and_encode(self, obj, block, timeout):
        """A place in the queue (or Full), then the encoded bytes (the place given back if
        the object can't be encoded: a re-sent CUDA tensor, say)."""
        if self._closed:
            raise QueueClosedError("put" if block else "put_nowait", repr(self))
        self._put_here = True
        # a place: the semaphore counts the free ones (False: none came in time)
        if recorder.ENABLED:
            has_slot = trace.messages.take_slot(self, block, timeout)   # a full queue: a wait
            recorder.take_handles()             # count this message's handles from 0
        else:
            has_slot = self._sem.acquire(block, timeout)
        if not has_slot:
            raise Full
        try:
            return encode(obj, self._channel)
        except BaseException as exc:
            self._sem.release()
            raise_explained(exc, "put(obj)")
            raise

    def _feed(self, data):
        """Hand `data` to the feeder thread, as the stdlib's put does (the notempty lock held)."""
        if self._thread is None:
            self._start_thread()
        self._buffer.append(self._parcel(data))
        self._pending += 1                      # until the feeder has written it (see _pipe.py)
        self._notempty.notify()

    def _parcel(self, data):
        """What the feeder is given for `data`: the bytes, wrapped so that the feeder's pickling
        copies them as they are (see ``_codec.Pickled``). While recording, the put is recorded
        now, and the item tagged with its id, for the write the feeder's hook records."""
        item = Pickled(data)
        if recorder.ENABLED:
            messages = trace.messages
            qid, msg = queue_id(self), messages.next_msg()
            recorder.emit("queue.put", queue=qid, msg=msg, nbytes=len(data),
                          **messages.carried(recorder.take_handles()))
            item = messages.for_feeder(self, item, qid, msg)
        return item

    def get(self, block=True, timeout=None):
        """The stdlib's get: one message read from the pipe, then rebuilt (``_receive``)."""
        _stepped("queue.get", self)
        if self._closed:
            raise QueueClosedError("get" if block else "get_nowait", repr(self))
        if recorder.ENABLED:
            messages = trace.messages
            messages.watch_reads(self)          # the read records queue.get (see there)
            if block and messages.get_would_wait(self):     # nothing to read yet: a wait
                return messages.waiting_get(timeout, Queue._receive, self, block, timeout)
        return self._receive(block, timeout)

    def _receive(self, block, timeout):
        """A copy of the stdlib's get (Python 3.11), with ``decode`` where the stdlib calls
        ``ForkingPickler.loads`` (a lone tensor arrives as a short handle)."""
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
            return decode(res)
        except BaseException as exc:            # read, but not rebuilt (its sender exited, say)
            if recorder.ENABLED:
                recorder.emit("queue.get_failed", queue=queue_id(self), error=type(exc).__name__)
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
        """As the stdlib's. After ``close()`` (which closed the reading end it looks into): True
        where nothing can ever have been put in the queue -- made in this process after its last
        ``os.fork()``, never pickled (so no other process has it) and never put to here -- as the
        stdlib's ``empty()`` answers for a queue closed before any use (its ``close()`` does
        nothing there); otherwise :class:`QueueClosedEmptyError`, as the stdlib's does for a
        queue closed after a put (its feeder closed the reading end). Where another process
        has the queue mpviz cannot know, so it says so rather than guess."""
        if self._closed:
            if not self._put_here and self._made_at_fork == _forks:
                return True
            raise QueueClosedEmptyError("empty", repr(self))
        return super().empty()


class JoinableQueue(multiprocessing.queues.JoinableQueue, Queue):
    """``multiprocessing.JoinableQueue`` whose ``put`` encodes synchronously (and writes small
    messages straight into the pipe, like :class:`Queue`)."""

    put = Queue.put            # ours, not the stdlib JoinableQueue's (before Queue in the MRO)

    def _enter(self, data):
        with self._notempty, self._cond:
            # Count the task before the consumer can see it: its task_done() must find it.
            self._unfinished_tasks.release()
            try:
                if not self._write_now(data):
                    self._feed(data)
            except BaseException:
                self._unfinished_tasks.acquire(False)
                raise
