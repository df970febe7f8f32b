"""The receive cache: a storage that arrives twice is mapped once, and is the same object.

Keys name the *memory*, not the message: ``("file_descriptor", st_dev, st_ino)`` — the same
anonymous segment has the same inode in every process — or ``("file_system", name)``. Values
are weak references, so the cache never keeps a storage alive by itself.

Because the sender also registers the storages it sends, a buffer that goes out and comes back
(a consumer returning it to its producer, as the best-practices note advises) turns back into
the very Storage object it left as: no copy, no new mapping, no new descriptor.

A storage this process has sent stays alive a moment after its last tensor is dropped — the fd
server keeps what it offered until the receiver fetches it or its release arrives; under
``file_system`` a process keeps what it received and sent on for one to two ``LINGER_SECONDS``
(unless the shared-memory cache is on: that keeps the mapping instead) — so a tensor that comes
straight back finds it here too.

Adapted from torch's ``shared_cache`` in ``torch/multiprocessing/reductions.py`` (a dict of
``StorageWeakRef``). Simplified: dead entries are dropped when looked up or when the cache has
doubled since the last sweep, instead of torch's fixed 128-entry limit.
"""
import os
import threading
import weakref

_lock = threading.Lock()
_entries = {}
_sweep_at = 128


def get(key):
    """The live storage for `key` in this process, or None."""
    ref = _entries.get(key)
    storage = ref() if ref is not None else None
    if ref is not None and storage is None:
        with _lock:
            if _entries.get(key) is ref:
                del _entries[key]
    return storage


def put(key, storage):
    global _sweep_at
    ref = _entries.get(key)
    if ref is not None and ref() is storage:
        return  # known already (a storage sent again): nothing to change, no lock to take
    with _lock:
        _entries[key] = weakref.ref(storage)
        if len(_entries) >= _sweep_at:
            for k in [k for k, r in _entries.items() if r() is None]:
                del _entries[k]
            _sweep_at = max(128, 2 * len(_entries))


def _after_fork():
    global _lock
    _lock = threading.Lock()  # the parent's lock may have been held by a thread that is not here


os.register_at_fork(after_in_child=_after_fork)
