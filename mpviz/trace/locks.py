"""Lock events: who waits for which lock, who holds it, when it is released.

A multiprocessing ``Lock``/``RLock``/``Semaphore`` is a thin Python object over a C ``SemLock``;
``SemLock._make_methods`` copies the C object's ``acquire``/``release`` onto the instance. While
recording we replace ``_make_methods`` so that *user* locks get Python wrappers instead::

    acquire(block, timeout):
        try the C acquire without blocking ── got it ──► emit lock.acquire
        └─ taken: emit lock.wait, then block in the C acquire ─► emit lock.acquire (or lock.timeout)
    release():  emit lock.release (timestamped before the C release, so the next owner's
                acquire always comes after it in the trace), then the C release

Trying first without blocking means a ``lock.wait`` appears only when a thread really waited.
A ``Condition`` needs nothing of its own: its ``wait`` releases and re-acquires its (user) lock.

"User" locks are those created by code outside the stdlib's own machinery: the locks inside a
Queue, a Pool, a Manager, an Event or a Barrier are left alone (they would bury the picture in
noise). Where a lock comes from is told by the file of the code that created it -- the stdlib's
directory, or an installed package's -- not by a list of module names: a new Python adds locks
of its own (3.13's ``sysconfig`` makes one when it is first imported, mid-run). A spawned child
cannot see who created a lock it unpickles, so the parent passes the ids of its instrumented
locks along with the spawn preparation data (see ``hooks.py``).

On request (``record(threading_locks=True)``) ``threading.Lock``/``RLock`` made by user code are
wrapped the same way (``_TracedThreadLock``).
"""
import functools
import os
import site
import sys
import sysconfig
import threading
import time
import weakref
from itertools import count

from multiprocessing import synchronize

from .. import _stops
from . import recorder
from .events import semlock_id

user_lock_ids = set()           # ids of instrumented multiprocessing locks (sent to children)
_orig = {}
# The stdlib's directories and every site directory: a venv's site-packages, and also Debian's
# /usr/lib/python3/dist-packages (apt's packages: not sysconfig's purelib, which is /usr/local's)
# and the user's (pip install --user).
_LIBRARY_DIRS = tuple({os.path.join(os.path.realpath(path), "") for path in
                       [sysconfig.get_paths()[name]
                        for name in ("stdlib", "platstdlib", "purelib", "platlib")]
                       + site.getsitepackages() + [site.getusersitepackages()]})
_QUIET_OWNERS = ("Event", "Barrier")


def _is_machinery(module, skip_modules):
    return module in skip_modules or module.startswith("mpviz.multiprocessing")


def _creator_is_user(skip_modules, lock_type):
    """Walk the stack out of the lock machinery; is the first other frame user code?"""
    f = sys._getframe(2)
    inside = []
    while f is not None and _is_machinery(f.f_globals.get("__name__", ""), skip_modules):
        inside.append(f.f_code.co_qualname if hasattr(f.f_code, "co_qualname") else
                      f.f_code.co_name)
        f = f.f_back
    if f is None:
        return False
    module = f.f_globals.get("__name__", "")
    if module.startswith("mpviz."):      # mpviz's own, but for the programs that play a user's
        user = module == "mpviz.trace.testing" or module.startswith("mpviz.scenarios")
    else:
        user = not in_library(f.f_code.co_filename)
    if user:
        if any(q.startswith(o + ".") for q in inside for o in _QUIET_OWNERS):
            return False
        if any(q.startswith("Condition.") for q in inside):
            return lock_type == "RLock"         # a Condition's own mutex, not its semaphores
        return True
    return False


@functools.lru_cache(maxsize=512)
def in_library(filename):
    """True for a file of the stdlib (a frozen module of it included) or of an installed
    package: code that no user of mpviz wrote."""
    if filename.startswith("<frozen "):
        return True
    return os.path.realpath(filename).startswith(_LIBRARY_DIRS)


def _user_name(obj):
    """The name the waiting code calls `obj` by -- a local or global of the first frame outside
    the recorder and the stdlib's threading/multiprocessing -- or None. A picture then says
    "lock '_library_lock'" instead of an id. Asked only when a thread has to wait."""
    f = sys._getframe(2)
    while f is not None and f.f_globals.get("__name__", "").startswith(
            ("mpviz.trace", "threading", "multiprocessing")):
        f = f.f_back
    if f is None or obj is None:
        return None
    for space in (f.f_locals, f.f_globals):
        for name, value in space.items():
            if value is obj:
                return name
    return None


def _named(name):
    return {"name": name} if name else {}


def _wrap(lock, lid, typ):
    sl = lock._semlock
    raw_acquire, raw_release = sl.acquire, sl.release
    me = weakref.ref(lock)             # (a strong one would make the lock a cycle with itself)

    def acquire(block=True, timeout=None):
        if _stops.pause: _stops.pause("lock.acquire", lid)  # a stepped run: wait for the stepper
        if not recorder.ENABLED:
            return raw_acquire(block, timeout)
        if raw_acquire(False):
            recorder.emit("lock.acquire", lock=lid, type=typ)
            return True
        if not block:
            return False
        recorder.emit("lock.wait", lock=lid, type=typ, timeout=timeout,
                      **_named(_user_name(me())))
        ok = raw_acquire(True, timeout)
        recorder.emit("lock.acquire" if ok else "lock.timeout", lock=lid, type=typ)
        return ok

    def release():
        if _stops.pause: _stops.pause("lock.release", lid)  # a stepped run: wait for the stepper
        ts = time.monotonic_ns()
        raw_release()
        if recorder.ENABLED:
            recorder.emit_at(ts, "lock.release", lock=lid, type=typ)

    lock.acquire, lock.release = acquire, release
    lock._mpviz_lock = lid


def _make_methods(self):
    _orig["SemLock._make_methods"](self)
    if not recorder.ENABLED or "_mpviz_lock" in self.__dict__:
        return
    lid, typ = semlock_id(self), type(self).__name__
    creating = sys._getframe(1).f_code is synchronize.SemLock.__init__.__code__
    if creating:
        if _creator_is_user({"multiprocessing.synchronize", "multiprocessing.context"}, typ):
            user_lock_ids.add(lid)
            _wrap(self, lid, typ)
    elif lid in user_lock_ids:              # unpickled in a spawned child
        _wrap(self, lid, typ)


def _enter(self):
    return self.acquire()


def _exit(self, *exc):
    self.release()


PATCHES = [
    (synchronize.SemLock, "_make_methods", _make_methods, "SemLock._make_methods"),
    (synchronize.SemLock, "__enter__", _enter, "SemLock.__enter__"),
    (synchronize.SemLock, "__exit__", _exit, "SemLock.__exit__"),
]


# --- threading locks, on request ----------------------------------------------------------

_thread_lock_ids = count(1)


class _TracedThreadLock:
    """A threading.Lock or RLock that records wait/acquire/release."""

    def __init__(self, inner, typ):
        self._inner, self._type = inner, typ
        self._id = f"t{os.getpid()}.{next(_thread_lock_ids)}"

    def acquire(self, blocking=True, timeout=-1):
        if _stops.pause: _stops.pause("lock.acquire", self._id)  # a stepped run: see stepper/gate.py
        inner = self._inner
        if not recorder.ENABLED:
            return inner.acquire(blocking, timeout)
        if inner.acquire(False):
            recorder.emit("lock.acquire", lock=self._id, type=self._type)
            return True
        if not blocking:
            return False
        recorder.emit("lock.wait", lock=self._id, type=self._type,
                      timeout=None if timeout < 0 else timeout, **_named(_user_name(self)))
        ok = inner.acquire(True, timeout)
        recorder.emit("lock.acquire" if ok else "lock.timeout", lock=self._id, type=self._type)
        return ok

    def release(self):
        if _stops.pause: _stops.pause("lock.release", self._id)  # a stepped run: see stepper/gate.py
        ts = time.monotonic_ns()
        self._inner.release()
        if recorder.ENABLED:
            recorder.emit_at(ts, "lock.release", lock=self._id, type=self._type)

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()

    def locked(self):
        return self._inner.locked()

    def __getattr__(self, name):       # _is_owned, _at_fork_reinit, ... of the real lock
        return getattr(self._inner, name)

    def __repr__(self):
        return f"<traced {self._inner!r} id={self._id}>"


def _thread_lock_factory(original, typ):
    def make(*args, **kwargs):
        inner = original(*args, **kwargs)
        if recorder.ENABLED and _creator_is_user({"threading"}, typ):
            return _TracedThreadLock(inner, typ)
        return inner
    make.__name__ = typ
    return make


THREADING_PATCHES = [
    (threading, "Lock", _thread_lock_factory(threading.Lock, "Lock"), "threading.Lock"),
    (threading, "RLock", _thread_lock_factory(threading.RLock, "RLock"), "threading.RLock"),
]
