"""A caching allocator for shared memory: keep segments whose pages are in, hand them out again.

Why: the expensive part of sharing a *fresh* tensor is not the copy but the kernel handing out
new pages (a page fault and a zeroed page per 4 KiB: several times slower than a copy into pages
already in; the figures: docs/PERFORMANCE.md), every step for a loop that sends a new 64 MiB
tensor. So, like torch's CUDA caching allocator for GPU memory, keep what was freed, reuse it::

    share_memory_(64 MiB) ──▶ allocate() ──▶ cache has a 64 MiB segment whose count is 1? ──yes──▶ reuse it
                                                    │ no                                          (pages already in)
                                                    ▼
                                             create a new one (shm.create)

    last view of a segment gone ──▶ park it here, with our count still in its header
                                    (over the byte budget: give back the oldest)

**When is reuse safe?** Only when no other process maps the segment and no handle to it is on its
way — otherwise they would see the next tensor's bytes. Both strategies keep a count in the
segment's header (:mod:`~mpviz.sharing.segment`): +1 per process that maps it (until its last
NumPy view is gone) and +1 per handle pickled and not yet received. A parked segment still holds
*our* 1, so "count == 1" proves nobody else is there, and nobody can come: only a holder can make
a new handle, and we are the only holder. The rest of the rule: :func:`take`.

Off by default (why, how to switch it on: :func:`enable`); received segments: :func:`keep_received`.
Adapted from the idea of torch's ``CUDACachingAllocator`` (keep freed blocks, reuse by size).
Simplified: exact sizes, one list, oldest evicted first; CPU shared memory in torch is never cached.
"""
import atexit
import os
import threading

from ..trace import recorder

_ENV = "MPVIZ_SHM_CACHE_BYTES"
DEFAULT_BYTES = 256 << 20  # what enable() uses when given no budget
MAX_ENTRIES = 64           # each cached file_descriptor segment is one open descriptor


def _budget_from_env():
    value = os.environ.get(_ENV, "0")
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"{_ENV}={value!r} is not a number of bytes; use e.g. "
                         f"{_ENV}={DEFAULT_BYTES} (256 MiB), or 0 to switch the cache off") from None


class _State:
    def __init__(self, budget):
        self.lock = threading.Lock()
        self.budget = budget
        self.parked = []       # oldest first
        self.received = {}     # key -> a received segment we let go of, kept mapped (oldest first)
        self.bytes = 0
        self.hits = self.misses = 0
        self.received_hits = 0
        self.closed = False    # at exit: keep nothing more


_state = _State(_budget_from_env())


def enable(max_bytes=DEFAULT_BYTES):
    """Cache up to `max_bytes` of freed shared segments (0 switches it off and frees the cache).

    Children started afterwards inherit the setting (through ``MPVIZ_SHM_CACHE_BYTES``).

    Off by default: a cached ``file_system`` segment stays visible in /dev/shm, and a cached
    ``file_descriptor`` segment keeps its descriptor open — both are exactly what the lessons
    teach not to expect after ``del t``. Switch it on with ``enable(max_bytes)`` or
    ``MPVIZ_SHM_CACHE_BYTES=268435456`` (children inherit the variable). Hits and misses are
    recorded as ``shm.cache`` events and counted in :func:`stats`."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ValueError(f"max_bytes must be a non-negative int (0 = off), not {max_bytes!r}")
    os.environ[_ENV] = str(max_bytes)
    _state.budget = max_bytes
    _trim()


def enabled():
    return _state.budget > 0 and not _state.closed


def stats():
    """What the cache holds and how often it helped: hits, misses, entries, bytes, budget, and
    of the entries, how many are kept received mappings (and how often one served again)."""
    st = _state
    return {"hits": st.hits, "misses": st.misses, "entries": len(st.parked) + len(st.received),
            "bytes": st.bytes, "budget": st.budget, "kept_received": len(st.received),
            "received_hits": st.received_hits}


def take(strategy, nbytes):
    """A parked segment of exactly `nbytes` under `strategy` that only we hold, revived; or None.

    A segment that a crashed process still counts is never reused (it is given back when
    evicted). Locally, a parked segment is reused only once no NumPy view of its old bytes is
    alive in this process."""
    st = _state
    found = None
    with st.lock:
        for i, parked in enumerate(st.parked):
            if parked.strategy == strategy and parked.nbytes == nbytes and parked.sole_holder():
                found = st.parked.pop(i)
                st.bytes -= nbytes
                break
        if found is None:
            st.misses += 1
        else:
            st.hits += 1
    if recorder.ENABLED:
        recorder.emit("shm.cache", hit=found is not None, nbytes=nbytes, strategy=strategy,
                      name=getattr(found, "name", None))
    return found.revive() if found is not None else None


def _may_keep(nbytes):
    """Whether the cache takes a segment of `nbytes` (and, the first time, the exit hook)."""
    st = _state
    if st.budget <= 0 or st.closed or nbytes > st.budget or nbytes == 0:
        return False
    arm_exit_hook()
    return True


def arm_exit_hook():
    """Give the cache back at exit: registered once, and only after a segment exists — so after
    weakref's own exit hook (registered with the first finalizer), which it must run before:
    atexit runs the last registered first. Then the finalizers that weakref runs at exit find the
    cache closed, and release their segments instead of parking them where nothing frees them."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(close)
        _atexit_registered = True


def park(parked):
    """Keep `parked` (a segment nobody here uses) for reuse. False: not kept, free it yourself."""
    st = _state
    if not _may_keep(parked.nbytes):
        return False
    with st.lock:
        st.parked.append(parked)
        st.bytes += parked.nbytes
    _trim()
    return True


def keep_received(kept):
    """Keep `kept` (a received segment nobody here uses, its count already given back) mapped,
    in case the same memory arrives again. False: not kept (cache off, or too big).

    With the cache on, a process that let go of a segment it *received* keeps it mapped as well
    — but, unlike its own, with its count given back: it no longer counts as a holder, so the
    producer may reuse the segment at once. When the same memory arrives again (a consumer that
    drops each tensor it gets, then receives the next one in the same buffer), the handle finds
    the mapping here (:func:`take_received`): no descriptor to fetch, no ``shm_open``, no
    ``mmap``: such a round trip costs about what the queue costs (docs/PERFORMANCE.md). A kept
    mapping nobody else counts any more (count 0) is let go at the next visit::

        received storage's last view gone ──▶ keep_received: count ourselves out, keep the mapping
        the same key arrives again        ──▶ take_received: it is ours again (the handle's count)
    """
    st = _state
    if not _may_keep(kept.nbytes):
        return False
    with st.lock:
        old = st.received.pop(kept.key, None)
        st.received[kept.key] = kept
        st.bytes += kept.nbytes - (old.nbytes if old is not None else 0)
    if old is not None:
        old.free()
    _trim()
    return True


def take_received(key):
    """The kept mapping of the memory named by `key`, revived (it takes over the arriving handle's
    count); or None."""
    st = _state
    if not st.received:
        return None
    with st.lock:
        kept = st.received.pop(key, None)
        if kept is None:
            return None
        st.bytes -= kept.nbytes
        st.received_hits += 1
    if recorder.ENABLED:
        recorder.emit("shm.cache", hit=True, nbytes=kept.nbytes, strategy=kept.strategy,
                      name=kept.name, received=True)
    return kept.revive()


def _trim():
    st = _state
    evicted = []
    with st.lock:
        # kept received mappings first: those nobody else counts any more (we would be the last
        # to map that memory), then the oldest, while over the budget
        for key, kept in list(st.received.items()):
            if kept.orphaned():
                del st.received[key]
                st.bytes -= kept.nbytes
                evicted.append(kept)
        while st.received and (st.bytes > st.budget or len(st.received) > MAX_ENTRIES):
            oldest = st.received.pop(next(iter(st.received)))
            st.bytes -= oldest.nbytes
            evicted.append(oldest)
        while st.parked and (st.bytes > st.budget or len(st.parked) > MAX_ENTRIES):
            oldest = st.parked.pop(0)
            st.bytes -= oldest.nbytes
            evicted.append(oldest)
    for parked in evicted:
        parked.free()


def clear():
    """Give every parked segment back (count ourselves out; unlink names nobody holds)."""
    st = _state
    with st.lock:
        parked, st.parked, st.bytes = st.parked + list(st.received.values()), [], 0
        st.received = {}
    for p in parked:
        p.free()


def close():
    """At exit: free the cache and keep nothing from now on."""
    _state.closed = True
    clear()


def _after_fork_in_child():
    # The parked segments are counted for the parent, not for us: forget them without a word
    # (the parent will reuse them), and start with an empty cache.
    global _state
    old = _state
    _state = _State(old.budget)
    for parked in old.parked + list(old.received.values()):
        parked.forget()


os.register_at_fork(after_in_child=_after_fork_in_child)


# At exit, give everything back: through atexit in a normal process — registered by
# arm_exit_hook() once a segment exists (the cache's first new segment, or the first one it
# keeps), so after weakref's own exit hook, so that it runs *before* that hook unmaps the parked
# buffers (atexit runs last-registered first) — and in a multiprocessing child, which ends with
# os._exit, through file_system's exit hook, which calls close() before releasing what it maps.
_atexit_registered = False
