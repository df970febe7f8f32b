"""Where shared bytes live: the two sharing strategies, chosen once per platform.

=================  ==========================================  ===================================
strategy           the handle that travels                     what can go wrong
=================  ==========================================  ===================================
file_descriptor    "ask process P for descriptor #t"           P exited before you asked; one fd
                   (anonymous memory, fd passed by P)          per held storage → too many fds
file_system        "/dev/shm/mpviz_…" (a name, refcounted)     a killed holder leaks the name
                                                               (the shm manager cleans it up)
=================  ==========================================  ===================================

``file_descriptor`` needs Linux (``SCM_RIGHTS`` + abstract sockets), so elsewhere ``file_system``
is the only strategy, as in torch. The setting is read once, where a storage is pickled, and
passed down from there. Unlike torch, children started with spawn/forkserver inherit the
parent's choice (through an environment variable), so a child's sends behave like its parent's.
"""
import os
import sys

if sys.platform.startswith("linux"):
    _ALL = ("file_descriptor", "file_system")
else:  # macOS and friends: no memfd-like anonymous segments to pass around
    _ALL = ("file_system",)

_ENV = "MPVIZ_SHARING_STRATEGY"  # so that spawned children share the way their parent does
TAG_MAX_BYTES = 200  # a segment's name is at most 255 bytes; mpviz adds up to ~40 to the tag


def _check_environment(env):
    """Refuse, at import, environment settings that would be ignored or fail far from here."""
    strategy = env.get(_ENV, "")
    if strategy and strategy not in _ALL:
        raise ValueError(f"{_ENV}={strategy!r} is not a sharing strategy here; this platform has "
                         f"{sorted(_ALL)}. Fix: {_ENV}=file_system, or unset it.")
    cache = env.get("MPVIZ_SHM_CACHE_BYTES", "0").strip()
    if cache.lstrip("-").isdigit() and int(cache) < 0:
        raise ValueError(f"MPVIZ_SHM_CACHE_BYTES={cache!r} is negative: it is how many bytes of "
                         f"freed shared memory to keep for reuse. Fix: a size such as 268435456 "
                         f"(256 MiB), or 0 to switch the cache off.")
    tag = env.get("MPVIZ_SHM_TAG", "")
    if len(tag.encode("utf-8", "surrogateescape")) > TAG_MAX_BYTES:
        raise ValueError(f"MPVIZ_SHM_TAG is {len(tag.encode('utf-8', 'surrogateescape'))} bytes "
                         f"long ({tag[:20]!r}...): it becomes part of every segment's name in "
                         f"/dev/shm, and a name may be at most 255 bytes. Fix: a tag of at most "
                         f"{TAG_MAX_BYTES} bytes, such as 'run1_'.")


_check_environment(os.environ)
_strategy = os.environ.get(_ENV) or _ALL[0]

from . import allocator, file_descriptor, file_system, handles, shm_manager  # noqa: E402 (after the check above)

_MODULES = {"file_descriptor": file_descriptor, "file_system": file_system}


def get_all_sharing_strategies():
    """The strategies this platform supports (a set, as in torch)."""
    return set(_ALL)


def get_sharing_strategy():
    """The strategy used for storages pickled from now on."""
    return _strategy


def set_sharing_strategy(new_strategy):
    """Choose how storages are shared from now on: 'file_descriptor' or 'file_system'."""
    global _strategy
    if not isinstance(new_strategy, str):
        raise TypeError(f"new_strategy must be a str such as 'file_system', not {type(new_strategy).__name__}")
    if new_strategy not in _ALL:
        raise ValueError(
            f"invalid sharing strategy {new_strategy!r}; expected one of {sorted(_ALL)} "
            f"(see mpviz.multiprocessing.get_all_sharing_strategies())")
    _strategy = new_strategy
    os.environ[_ENV] = new_strategy


def settings():
    """This process's sharing settings, for a child to adopt (see ``apply_settings``)."""
    return {"strategy": _strategy, "shm_manager": shm_manager.enabled()}


def apply_settings(values):
    """Adopt a parent's sharing settings (mpviz's Process does this in the child, first thing).

    Environment variables alone are not enough: a forkserver child inherits the environment the
    fork server had when it *started*, not the one its parent has now.
    """
    set_sharing_strategy(values["strategy"])
    if values["shm_manager"] != shm_manager.enabled():
        shm_manager.enable(values["shm_manager"])


def allocate(nbytes, strategy, data=None):
    """A shared segment of `nbytes` bytes under `strategy`: the one place segments come from.

    With `data` (a 1-D uint8 NumPy array of `nbytes` bytes) the segment holds a copy of it;
    without, its bytes are undefined and the caller fills them. With contiguous `data`, a new
    segment is filled by ``write(2)`` (one pass over memory; see mapping.write_into), other
    `data` by a copy after mapping; with the caching allocator on
    (:mod:`~mpviz.sharing.allocator`), a segment freed earlier whose pages are already in may come
    back instead, and is filled by a copy.
    """
    try:
        module = _MODULES[strategy]
    except KeyError:
        raise ValueError(f"invalid sharing strategy {strategy!r}; expected one of {sorted(_ALL)}") from None
    if data is not None and data.shape != (nbytes,):
        raise ValueError(f"data holds {data.nbytes} bytes in shape {data.shape}, the segment "
                         f"{nbytes}: they must match. Fix: pass the storage's own flat uint8 bytes.")
    if data is not None and not data.flags.c_contiguous:
        segment = allocate(nbytes, strategy)   # write(2) wants one run of bytes: copy instead
        segment.array[...] = data
        return segment
    if allocator.enabled():
        segment = allocator.take(strategy, nbytes)
        if segment is not None:
            if data is not None:
                segment.array[...] = data
            return segment
        segment = module.create(nbytes, data)
        allocator.arm_exit_hook()  # now, after weakref's own exit hook: see the allocator
        return segment
    return module.create(nbytes, data)
