"""What a handle takes, and how a message that is never made gives it back.

Pickling a shared storage for another process makes a *handle*, and making it takes something
in this process, so that the memory waits for its receiver (see ``reductions.storage_handle``)::

    file_system      one count in the segment's header          (segment.incref)
    file_descriptor  one count, and one fd offer on this        (segment.incref,
                     process's fd server                         fd_passing.offer)
    a CUDA block     one count in its slot, one send            (mpviz.cuda.ipc.share)

The receiver takes them over when it unpickles. But ``conn.send((t, lambda: 0))`` shares ``t``,
makes its handle, then fails on the lambda: no receiver will ever take over what the handle took
(a name left in /dev/shm for ever, a descriptor open in the fd server).

So each pickling of a message is a *scope* (one per thread), in which every handle notes what it
took (:func:`note_taken`); a pickling that raises gives all of it back before the error goes up
(:func:`dumps_or_give_back`). A pickle made inside another is a message of its own: its scope
gives back only what it took itself (once made, its bytes may travel on their own).

One place opens the scope for every channel ``multiprocessing`` pickles on: ``ForkingPickler.dump``
(:func:`install`). ``ForkingPickler.dumps`` (``Connection.send``: a ``Pipe``, Pool tasks;
``SimpleQueue.put``: Pool results) and ``reduction.dump`` (Process arguments under spawn and
forkserver) both call it. mpviz's own ``Queue`` pickles with a pickler of its own (``_codec.py``)
and opens the scope itself, saying which pipe the bytes will take. A lone tensor it does not
pickle: its short handle is made last and marshalled, so no scope is opened for it.
"""
import pickle
import threading
from multiprocessing.reduction import ForkingPickler

from . import fd_passing

_scope = threading.local()
# While a message is pickled in this thread, _scope.message is a list: first the queue pipe its
# bytes will take (an inode; None: not a queue of mpviz's), then (taken, fd offer token) for
# each handle made so far. One list, so that opening a scope costs one store (every pickling
# that multiprocessing does opens one: see the bottom of this module).


def note_taken(taken, token):
    """A handle was just made in this thread: it took one count -- `taken`, whose ``decref()``
    gives it back (a shared segment, or a CUDA block's ``ipc._Taken``) -- and, under
    ``file_descriptor``, the fd offer `token` (None otherwise)."""
    message = _scope.__dict__.get("message")
    if message is not None:
        message.append((taken, token))


def channel():
    """The inode of the queue pipe the message now being pickled will travel in; None where
    that is not known (any channel but mpviz's Queue)."""
    message = _scope.__dict__.get("message")
    return None if message is None else message[0]


def dumps_or_give_back(dumps, obj, channel=None):
    """``dumps(obj)`` as one message's scope: if it raises, every handle made in it gives back
    what it took before the error goes up. `channel`: the queue pipe its bytes will take."""
    scope = _scope.__dict__
    outer = scope.get("message")                 # a pickle made inside another one, or None
    message = scope["message"] = [channel]
    try:
        return dumps(obj)
    except BaseException:
        give_back(message)
        raise
    finally:
        scope["message"] = outer


def give_back(message):
    """Undo the handles of a message that will never travel: withdraw each fd offer, give
    each count back."""
    for taken, token in reversed(message[1:]):
        if token is not None:
            fd_passing.withdraw(token)
        taken.decref()
    del message[1:]


# -- the one place every multiprocessing channel pickles through --------------------------------

_pickler_dump = pickle.Pickler.dump   # what ForkingPickler.dump is without this module


def _forking_dump(self, obj):
    """``ForkingPickler.dump``, as one message's scope: ``dumps_or_give_back`` written out for
    a pickler (this runs for every message multiprocessing sends, so it costs one store)."""
    scope = _scope.__dict__
    outer = scope.get("message")
    message = scope["message"] = [None]          # its channel: not one of mpviz's queues
    try:
        return _pickler_dump(self, obj)
    except BaseException:
        give_back(message)
        raise
    finally:
        scope["message"] = outer


def install():
    """Make every ``ForkingPickler`` pickling a scope that gives back what it took, if it fails.

    Done by mpviz.storage on import, before any storage of ours can be pickled (installing it
    when the first handle is made would be too late for the message that makes it). The one
    change mpviz makes to the stdlib's pickler besides registering its reducers: the same bytes,
    the same errors, for one list and a ``try`` per message (a few tenths of a microsecond)."""
    if ForkingPickler.__dict__.get("dump") is not _forking_dump:
        ForkingPickler.dump = _forking_dump
