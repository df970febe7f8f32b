"""fork-held-lock: a thread holds a lock at the moment of ``fork``; the child waits for it forever.

What happens: ``fork()`` copies the whole memory of the parent into the child -- every lock
included, in the state it has at that instant -- but only the thread that called ``fork``. If
another thread of the parent held a lock at that instant, the child's copy of the lock is held
by a thread that does not exist in the child. Nobody will ever release it. The first time the
child needs that lock (a library's internal lock: logging, a thread pool, OpenMP, OpenCV...), it
blocks forever, and the parent, joining the child, blocks with it. This is why DataLoader/Pool
hang with ``num_workers > 0`` when the parent has busy threads (torch issues #1355, #45198)::

    parent   main thread ──── fork() ─────────────── join() ... waits forever
             thread T    ─[ holds LOCK ]─ release ─▶           (the parent's lock is fine)
    child    main thread ─── LOCK.acquire() ... waits forever: its copy is held by "T",
                              a thread that was never copied into the child

The fix: don't fork a process that has threads -- use the ``spawn`` (or ``forkserver``) start
method: the child is a fresh interpreter that imports the library and gets a fresh, free lock.
(Or, for a library you control, ``os.register_at_fork`` to re-create its locks in the child.)

Here the library is played by ``library_lock()``: a module-level lock made on first use, like
``logging``'s. Recording with ``threading_locks=True`` puts every wait and hold of it on the
timeline and in the wait-for graph.
"""
import threading

from ._common import context, get, start_method_param, step

SUMMARY = "a thread holds a lock at fork; the child blocks forever on its copy of it"
PARAMS = {
    "start_method": start_method_param(
        "fork", "fork copies the held lock into the child (deadlock); spawn and forkserver "
                "start a fresh interpreter with a fresh lock (ok)"),
}
STALL_SECONDS = 2.5
THREADING_LOCKS = True

_library_lock = None


def library_lock():
    """The 'library's' internal lock, made on first use (a fresh one in every new interpreter)."""
    global _library_lock
    if _library_lock is None:
        _library_lock = threading.Lock()
    return _library_lock


def use_library(out):
    """The child: call into the library, which takes its lock."""
    step("child calls the library (it needs the library's lock)")
    with library_lock():
        step("child got the lock")
    out.put("done")


def _busy_thread(held, forked):
    with library_lock():            # a background thread, busy inside the library ...
        held.set()
        forked.wait(10)             # ... at the moment the main thread forks


def drive(p, details):
    ctx = context(p)
    out = ctx.Queue()
    library_lock()
    held, forked = threading.Event(), threading.Event()
    worker = threading.Thread(target=_busy_thread, args=(held, forked), name="library-worker")
    worker.start()
    held.wait(10)
    step("parent starts a child while its worker thread holds the lock",
         start_method=p["start_method"])
    child = ctx.Process(target=use_library, args=(out,), name="child")
    child.start()
    forked.set()
    worker.join()
    details["child_pid"] = child.pid
    details["lock_held_at_start"] = True
    step("parent joins the child")
    child.join()                    # under fork this never returns: the watchdog ends the run
    details["child_exitcode"] = child.exitcode
    details["child_finished"] = get(out, what="word from the child") == "done"


def verdict(t, details):
    locks = t.locks()
    child = details.get("child_pid")
    waiting = [w for lock in locks for w in lock.waiting if w[0] == child]
    if "stuck" in details:
        return "deadlock", (
            "The parent forked while its worker thread held the library's lock. The child got a "
            "copy of the lock in the 'held' state, but not the thread that held it, so nobody in "
            "the child can ever release it: the child waits on it forever (its lane ends in a "
            "lock wait that never turns into a hold"
            + (", and the wait-for graph shows an owner that does not exist in the child" if
               waiting else "") +
            "), and the parent waits forever in join(). Fix: start children with 'spawn' or "
            "'forkserver' (a fresh interpreter, a fresh lock), or never fork while threads run.")
    if details.get("child_finished"):
        return "ok", (
            f"The parent's worker thread held the library's lock when the child started, but "
            f"under '{details['params']['start_method']}' the child is a fresh interpreter: "
            f"it made its own, free lock on first use, took it at once and finished. Compare "
            f"start_method='fork', where the child inherits the held lock and hangs.")
    return "error", f"The child did not finish normally (exit code {details.get('child_exitcode')})."
