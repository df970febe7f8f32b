"""The stepped process's side of stepping: stop before an interesting operation, wait for "go".

The recorder's hooks (trace/hooks.py, locks.py, messages.py), mpviz's Queue and reductions.py's
``rebuild`` (see ``_stop_before_attach`` there) each have one line, and do not import us::

    if _stops.pause: _stops.pause("lock.acquire", lid)        # stops: mpviz/_stops.py

``_stops.pause`` is None in a process that is not stepped. In a stepped one ``activate`` puts
``_pause`` there: the calling thread tells the controller what it is about to do and blocks in
``recv`` until the controller answers ``go``::

    stepped thread                              controller (the Stepper, in your kernel)
    --------------                              ----------------------------------------
    pause("lock.acquire", "L")
      connect (once per thread) ──────────────▶ accept: a new thread
      send {"t": "pause", who, op, obj} ──────▶ a choice: "child/main: acquire lock L"
      recv() ... the thread is paused here            ...the learner clicks it...
      ◀─────────────────────────────────────── "go"
    return: the real acquire runs (and is recorded, as always)

Each thread has its own connection (a Unix socket), so the controller wakes exactly one thread.
A process's "hello" connection: :func:`_hello`; which processes are stepped: :func:`activate`.
Adapted from the idea of a deterministic scheduler for tests (CHESS, loom): threads ask a
scheduler for permission at each synchronisation point. Left out: operations that are not
synchronisation points run freely between two stops.
"""
import _thread
import json
import os
import socket
import threading
import weakref

from .. import _stops
from . import patches

ENV = "MPVIZ_STEP_SOCKET"
BOOT = "mpviz.stepper.gate:activate_from_env"   # autostart.ON_BOOT: a spawned child steps itself

_path = None                     # the controller's socket
_local = threading.local()       # .conn, .pid: this thread's connection to the controller
_sockets = weakref.WeakSet()     # every socket this process opened (a forked child closes them)
_names = {}                      # object id -> the name a program gave it (``name``)
_fork_hook = False


def activate(path=None):
    """Make this process stepped: every instrumented operation waits for the controller.

    Which processes are stepped: every process started under a stepped run. The controller sets
    ``MPVIZ_STEP_SOCKET`` in the run's environment; the run's first process calls ``activate``; a
    forked child carries the activation over (``os.register_at_fork``, with its own
    connections); a spawned child activates in ``autostart.boot``, which every spawned child of
    a recorded run calls (the controller names ``activate_from_env`` in ``ON_BOOT`` for it)."""
    global _path, _fork_hook
    _path = path or os.environ.get(ENV)
    if not _path:
        return False
    if not _fork_hook:
        os.register_at_fork(after_in_child=_after_fork_child)
        _fork_hook = True
    patches.install()
    try:
        _hello("start")
    except OSError as exc:
        raise RuntimeError(
            f"{ENV}={_path!r}: no stepper listens there ({exc.strerror or exc}), so this "
            f"process cannot be stepped. mpviz.step sets {ENV} for the processes of a stepped "
            f"run only; elsewhere (a shell export, a notebook's %env, a run that has ended) it "
            f"must not be set. Fix: unset {ENV}.") from None
    _stops.pause = _pause
    return True


def activate_from_env():
    """For ``autostart.boot``: step this process if the run it belongs to is stepped."""
    if os.environ.get(ENV) and _stops.pause is None:
        activate()


def _connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(_path)
    _sockets.add(s)
    return s


def _send(s, **msg):
    s.sendall((json.dumps(msg) + "\n").encode())


def who():
    """``process/thread``, as choices show it: ``child/main``, ``main/library-worker``."""
    import multiprocessing
    proc = multiprocessing.current_process().name
    thread = threading.current_thread()
    return (f"{'main' if proc == 'MainProcess' else proc}/"
            f"{'main' if thread is threading.main_thread() else thread.name}")


def _pause(op, obj=None, **info):
    """Tell the controller what this thread is about to do, and wait until it says go."""
    if obj is not None and not isinstance(obj, str):   # an object passed as it is (mpviz's
        obj = patches.object_id(obj)                    # Queue): named as name() names it
    conn = getattr(_local, "conn", None)
    if conn is None or _local.pid != os.getpid():          # first stop of this thread
        conn = _local.conn = _connect()                     # (closed when the thread ends:
        _local.pid = os.getpid()                            #  its thread-local goes away)
    _send(conn, t="pause", pid=os.getpid(), tid=threading.get_native_id(), who=who(), op=op,
          obj=obj, info=info)
    if conn.recv(16) != b"go\n":        # EOF: the controller is gone; nobody will wake us
        os._exit(70)


def name(obj, label):
    """Give a lock, queue or event a short name for the choices ("acquire lock L").

    Call it in the process that made `obj` (before starting children, so they know it too)."""
    key = patches.object_id(obj)
    if key is None:
        raise TypeError(f"mpviz.stepper.name: cannot name a {type(obj).__name__}; name a "
                        f"multiprocessing Lock, RLock, Queue, Event, Condition or a threading Lock")
    _names[key] = str(label)
    if _hello_conn is not None:
        _send(_hello_conn, t="name", obj=key, name=str(label))
    inner = getattr(obj, "_lock", None)             # a Condition's own lock: "C.lock"
    if inner is not None and patches.object_id(inner) is not None and \
            patches.object_id(inner) != key:
        name(inner, f"{label}.lock")
    return obj


def point(label):
    """A stop of your own choosing: the thread waits here for the controller (in a stepped run;
    elsewhere nothing happens). ``point("write row 2")``: the choice reads "... : write row 2"."""
    if _stops.pause is not None:
        _stops.pause("point", None, text=str(label))


# --- the process's own connection ----------------------------------------------------------

_hello_conn = None


def _hello(how):
    """Each process keeps one "hello" connection open for its whole life: the controller learns
    of the process at once (so it can wait for a child that is still starting), and sees it end
    (EOF). A small raw thread reads that connection: if the controller goes away (kernel
    interrupted or killed), the process ends itself at once -- no process is ever left paused
    with nobody to wake it."""
    global _hello_conn
    _hello_conn = _connect()
    _send(_hello_conn, t="hello", pid=os.getpid(), ppid=os.getppid(), how=how,
          names=_names)
    _thread.start_new_thread(_watch_controller, (_hello_conn,))   # (raw: not a traced Thread)


def _watch_controller(conn):
    """Ends this process when the controller goes away (its end of `conn` closes)."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    if conn is _hello_conn:             # (not a parent's connection, closed in a forked child)
        os._exit(71)


def _after_fork_child():
    """A forked child: the parent's connections are the parent's threads' -- close our copies
    (else the controller would not see those threads end) and say hello as a new process."""
    global _hello_conn
    for s in list(_sockets):
        try:
            s.close()
        except OSError:
            pass
    _hello_conn = None
    _local.__dict__.clear()
    if _stops.pause is not None:
        _hello("fork")
