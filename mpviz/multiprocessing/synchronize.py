"""An ``Event`` whose ``set()`` does not hang when a waiter was killed inside ``wait()``.

How the stdlib's Event works (CPython's Lib/multiprocessing/synchronize.py): a semaphore
``_flag`` (1: set) and a Condition built of four semaphores::

    _lock the condition's mutex (every method holds it); _wait_semaphore the waiters sleep on;
    _sleeping_count / _woken_count +1 by each waiter as it goes to sleep / wakes

    wait():  with _lock: _sleeping_count += 1; release _lock; acquire _wait_semaphore
                         _woken_count += 1; acquire _lock again
    set():   with _lock: _flag = 1; notify_all():
                             release _wait_semaphore once per sleeper counted
                             acquire _woken_count once per sleeper   <-- waits for each "awake"

A waiter killed (SIGKILL, the OOM killer) while asleep in ``wait()`` was counted in
``_sleeping_count`` and will never add to ``_woken_count``: the next ``set()`` waits for it for
ever, holding ``_lock`` -- and every later ``wait()``, ``set()``, ``clear()`` and ``is_set()``
waits for that lock (torch.multiprocessing's Event is the stdlib's).

mpviz's Event keeps all of that and adds one thing: while it sleeps, each waiter writes its pid
(and its process's start time, so that a recycled pid is not taken for it) into a slot of a
small shared array, and clears the slot before it says "awake". ``set()`` waits for each "awake"
with a timeout; when one is late it looks at the slots: a sleeper whose process is gone counts
as awake (its slot is cleared), with a ``RuntimeWarning`` naming it, and ``set()`` goes on.
A lock holder killed inside ``_lock`` gives ``BrokenEventError`` (below); what is left out too.
"""
import mmap
import os
import warnings
import weakref
from multiprocessing import context, reduction, synchronize

from .. import _proc

SLOTS = 1023         # sleepers tracked at once (16 KiB; a page holds 255 of them, and only
                     # the pages the sleepers write to take memory)
POLL_S = 0.2         # how long set() waits for an "awake" (or for the lock) before it looks


class BrokenEventError(RuntimeError):
    """Raised when an Event's lock is held by a process that has died (it was killed while
    inside one of the Event's methods): nobody can ever release it, so the Event is unusable."""

    def __init__(self, pid, call):
        self.pid, self.call = pid, call
        super().__init__(
            f"Event.{call}(): the Event's internal lock is held by process {pid}, which has "
            f"died (killed while inside one of the Event's methods); nobody can ever release "
            f"it, so every call on this Event would wait for ever (the stdlib's Event hangs "
            f"here). Fix: make a new Event for the processes still running, and end a process "
            f"with a message or Process.terminate() (SIGTERM), not SIGKILL, where you can.")

    def __reduce__(self):
        return type(self), (self.pid, self.call)


_me = None           # (pid, start time) of this process, read once per process


def _identity():
    global _me
    if _me is None or _me[0] != os.getpid():
        _me = (os.getpid(), _proc.start_time(os.getpid()) or 0)
    return _me


class _Slots:
    """The slots' memory: ``n`` 64-bit ints of the Event's own, not in the stdlib heap where
    ``Value``/``Array`` live. It is the Event's machinery, not the program's shared memory: the
    recorder draws the heap's arenas as the program's segments, and an Event must not add one
    there (torch's Event has none). In a fork context the memory is anonymous and shared
    (``fd == -1``): a forked child inherits the mapping, and no other process can ever get the
    Event (a fork context's semaphores cannot travel to a spawned child), so it holds no fd, as
    the stdlib's Event holds none. Under spawn or forkserver it is a memfd, passed to a child as
    the heap's arenas are (heap.py's ``reduce_arena``): by inheritance only, its fd duplicated
    into the spawned or forkserver child."""

    def __init__(self, n, fd=-1, forked_only=False):
        if fd == -1 and not forked_only:
            fd = os.memfd_create("mpviz-event-slots", os.MFD_CLOEXEC)
            os.ftruncate(fd, 8 * n)
        self.n, self.fd = n, fd
        self.buffer = mmap.mmap(fd, 8 * n)              # (fd -1: anonymous, MAP_SHARED)
        self.ints = memoryview(self.buffer).cast("q")   # (faster to index than ctypes')
        if fd != -1:
            weakref.finalize(self, os.close, fd)

    def __reduce__(self):
        context.assert_spawning(self)
        if self.fd == -1:
            raise RuntimeError("An Event created in a fork context is being shared with a "
                               "process in a spawn context. Fix: make the Event with the "
                               "context that starts the process (ctx.Event()).")
        return _rebuild_slots, (self.n, reduction.DupFd(self.fd))


def _rebuild_slots(n, dupfd):
    return _Slots(n, dupfd.detach())


def _alive(pid, start):
    now = _proc.start_time(pid)          # None: gone, or a zombie
    return now is not None and (not start or now == start)


class Condition(synchronize.Condition):
    """The stdlib's Condition (see the top), plus the sleepers' slots and the lock's holder:
    ``_slots`` = [holder pid, holder start, then (pid, start) for each of SLOTS sleepers]."""

    def __init__(self, lock=None, *, ctx):
        super().__init__(lock, ctx=ctx)
        self._array = _Slots(2 * (SLOTS + 1), forked_only=ctx.get_start_method() == "fork")
        self._slots = self._array.ints

    def __getstate__(self):
        return super().__getstate__() + (self._array,)

    def __setstate__(self, state):
        super().__setstate__(state[:-1])
        self._array = state[-1]
        self._slots = self._array.ints

    # --- the lock, with its holder written down ----------------------------------------------

    def __enter__(self):
        self._take_lock()
        return True

    def _take_lock(self):
        """Acquire the lock, and write this process down as its holder (pid last: the pair is
        complete); BrokenEventError if the holder died holding it (see the top)."""
        if not self._lock.acquire(False):             # (the usual case: free, one C call)
            while not self._lock.acquire(True, POLL_S):
                pid, start = self._slots[0], self._slots[1]
                # (still written down once found dead: it died holding the lock; a holder
                # that let go meanwhile -- and perhaps exited -- has cleared it)
                if pid and not _alive(pid, start) and self._slots[0] == pid:
                    raise BrokenEventError(pid, "set/clear/is_set/wait")
        pid, start = _me if _me is not None and _me[0] == os.getpid() else _identity()
        slots = self._slots
        slots[1] = start
        slots[0] = pid

    def __exit__(self, *exc):
        self._slots[0] = 0
        self._lock.release()

    # --- wait and notify: the stdlib's, with the slots ----------------------------------------

    def wait(self, timeout=None):
        if not self._lock._semlock._is_mine():
            raise RuntimeError("must acquire() condition before using wait()")
        slot = self._take_slot()
        self._sleeping_count.release()          # this thread is going to sleep
        count = self._lock._semlock._count()
        self._slots[0] = 0
        for _ in range(count):
            self._lock.release()
        try:
            return self._wait_semaphore.acquire(True, timeout)
        finally:
            if slot is not None:                # awake: a notifier need not look for us
                self._slots[slot] = 0
            self._woken_count.release()
            self._take_lock()                   # (an Event's lock: count is 1)
            for _ in range(count - 1):
                self._lock.acquire()

    def _take_slot(self):
        """Write this process into a free sleeper slot (the lock is held); its index, or None."""
        pid, start = _identity()
        for i in range(2, 2 * (SLOTS + 1), 2):
            if not self._slots[i]:
                self._slots[i + 1], self._slots[i] = start, pid      # (pid last: complete)
                return i
        return None

    def notify(self, n=1):
        if not self._lock._semlock._is_mine():
            raise RuntimeError("lock is not owned")
        while self._wait_semaphore.acquire(False):
            pass                    # a permit nobody took (a sleeper that died before it did)
        # account for the waiters that timed out since the last notify (as the stdlib does)
        while self._woken_count.acquire(False):
            self._sleeping_count.acquire(False)
        sleepers = 0
        while sleepers < n and self._sleeping_count.acquire(False):
            self._wait_semaphore.release()      # wake up one sleeper
            sleepers += 1
        if sleepers:
            awake = 0
            while awake < sleepers:             # wait for each to say "awake" -- or be dead
                if self._woken_count.acquire(True, POLL_S):
                    awake += 1
                else:
                    awake += self._forget_dead_sleepers()
            while self._wait_semaphore.acquire(False):
                pass                            # rezero, in case some timeouts just happened

    def _forget_dead_sleepers(self):
        """Clear the slots of sleepers whose process is gone; how many there were."""
        gone = 0
        for i in range(2, 2 * (SLOTS + 1), 2):
            pid, start = self._slots[i], self._slots[i + 1]
            if pid and not _alive(pid, start):
                self._slots[i] = 0
                gone += 1
                warnings.warn(RuntimeWarning(
                    f"Event.set(): process {pid} was waiting in Event.wait() and died (killed) "
                    f"before it woke; set() does not wait for it (the stdlib's Event would wait "
                    f"for ever here). Fix: end processes with Process.terminate() (SIGTERM) or a "
                    f"message, not SIGKILL, where you can."), stacklevel=5)
        return gone


class Event(synchronize.Event):
    """``multiprocessing.Event``, whose ``set()`` survives a waiter killed in ``wait()``.

    Whoever holds ``_lock`` writes its pid next to it: a process killed in the instant it held
    the lock leaves it held for good, and ``set()`` (or ``wait()``, ``clear()``, ``is_set()``)
    then raises ``BrokenEventError`` naming that pid, instead of hanging.

    Left out: more than ``SLOTS`` threads asleep at once (the extra ones have no slot: one of
    them killed hangs ``set()`` as in the stdlib), and a kill in the instant between a waiter
    clearing its slot and saying "awake". The Condition is the Event's own (it only notifies all).
    """

    def __init__(self, *, ctx):
        self._cond = Condition(ctx.Lock(), ctx=ctx)
        self._flag = ctx.Semaphore(0)
