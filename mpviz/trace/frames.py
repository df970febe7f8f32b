"""Keeping mpviz's own frames out of the user's tracebacks.

While a program is recorded, its calls to ``q.get()``, ``p.start()``, ``lock.acquire()`` ... go
through our hooks (waits.py, messages.py, hooks.py, locks.py). When such a call raises -- an
``Empty`` after ``get(timeout=1)``, a "Can't pickle local object" from ``p.start()`` -- the
traceback would show our frames between the user's line and the stdlib's::

    File "prog.py", line 5, in <module>            q.get(timeout=0.2)
    File ".../mpviz/trace/messages.py", line 291   <- not the user's, and not what they ran
    File ".../multiprocessing/queues.py", line 114 raise Empty

A learner reads every line of a traceback and believes it, so those frames are left out of
what is *printed*: Python's tracebacks are formatted by the ``traceback`` module
(``TracebackException``: print_exc, logging, a Process's or a Pool worker's crash) or by
``sys.excepthook`` / ``threading.excepthook`` (an uncaught exception). ``install()`` makes each
of them see the traceback without the frames of files in this folder; the exception itself,
and its traceback object, are not changed (a debugger still sees everything).

One frame of ours is kept: the innermost, when the error was raised in our code itself -- a
bug of ours must point at us, not at the user's line.
"""
import os
import sys
import threading
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_orig = {}


def ours(tb):
    return tb.tb_frame.f_code.co_filename.startswith(HERE)


def without_ours(tb):
    """A copy of the traceback chain `tb` without our frames (`tb` itself if it has none)."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    keep = [t for i, t in enumerate(entries) if not ours(t) or i == len(entries) - 1]
    if len(keep) == len(entries):
        return entries[0] if entries else None
    head = None
    for t in reversed(keep):
        head = types.TracebackType(head, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return head


def raised_at(tb):
    """Where an exception came from in the program's own code: ("follow_up (prog.py:10):
    `pool.apply(...)`", the function that called into that code: "_set") -- the innermost
    frame not the stdlib's, a package's or ours, and the library function that ran it (a
    Pool's result handler calls a callback from ``_set``); (None, None) if none is the
    program's."""
    from .stuck import _mine, own_line
    calls = []
    while tb is not None:
        code = tb.tb_frame.f_code
        calls.append((code.co_name, code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    mine = [i for i, (_, path, _) in enumerate(calls) if _mine(path)]
    if not mine:
        return None, None
    first = mine[-1]
    while first > 0 and _mine(calls[first - 1][1]):
        first -= 1                         # out to where the library called the program
    return own_line(calls[::-1]), (calls[first - 1][0] if first > 0 else None)


def error_words(exc):
    """"ValueError: Pool not running", at most 200 characters: an error as a verdict quotes it."""
    return f"{type(exc).__name__}: {exc}"[:200] if str(exc) else type(exc).__name__


def _traceback_exception_init(self, exc_type, exc_value, exc_traceback, *args, **kwargs):
    _orig["TracebackException.__init__"](self, exc_type, exc_value,
                                         without_ours(exc_traceback), *args, **kwargs)


def _print_uncaught(exc):
    """Hide our frames from the C printer of an uncaught exception: the exception (and those
    it chains to) carries the copy while it is printed, and its own traceback again after."""
    saved, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        saved.append((exc, exc.__traceback__))
        exc.__traceback__ = without_ours(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
    return saved


def _excepthook(exc_type, exc_value, exc_traceback):
    saved = _print_uncaught(exc_value)
    try:
        _orig["excepthook"](exc_type, exc_value, getattr(exc_value, "__traceback__",
                                                         exc_traceback))
    finally:
        for exc, tb in saved:
            exc.__traceback__ = tb


def _thread_excepthook(args):
    if args.thread is not None and args.exc_value is not None:
        # what ended the thread, for its thread.exit (hooks.py): a verdict can say it
        args.thread._mpviz_error = (error_words(args.exc_value),
                                    *raised_at(args.exc_value.__traceback__))
    saved = _print_uncaught(args.exc_value)
    try:
        tb = getattr(args.exc_value, "__traceback__", args.exc_traceback)
        _orig["threading.excepthook"](threading.ExceptHookArgs(
            [args.exc_type, args.exc_value, tb, args.thread]))
    finally:
        for exc, tb in saved:
            exc.__traceback__ = tb


def install():
    """Hide our frames from printed tracebacks (idempotent)."""
    if _orig:
        return
    _orig["TracebackException.__init__"] = traceback.TracebackException.__init__
    traceback.TracebackException.__init__ = _traceback_exception_init
    _orig["excepthook"] = sys.excepthook
    sys.excepthook = _excepthook
    _orig["threading.excepthook"] = threading.excepthook
    threading.excepthook = _thread_excepthook


def uninstall():
    """Put the printers back (those that are still ours: a program may have set its own)."""
    if not _orig:
        return
    traceback.TracebackException.__init__ = _orig.pop("TracebackException.__init__")
    if sys.excepthook is _excepthook:
        sys.excepthook = _orig["excepthook"]
    if threading.excepthook is _thread_excepthook:
        threading.excepthook = _orig["threading.excepthook"]
    _orig.clear()
