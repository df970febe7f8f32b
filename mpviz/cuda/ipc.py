"""CUDA IPC's lifetime rules: who may free a block, and when. The same for both backends.

A CUDA tensor crosses a process boundary as a *handle* to the producer's device block. The block
stays the producer's: it must not be freed while a consumer can still read it. So::

    producer                                   refcount slot       consumer
    x = randn(20,20).cuda()   cuda.alloc            -
    q.put(x)                  cuda.send           +1 = 1  ──handle──▶ y = q.get()   cuda.ipc_open
    del x                     cuda.limbo          (1 > 0: can't free yet)
                                                                      del y         cuda.ipc_close
                                                  -1 = 0  ◀───────────
    ipc_collect()             cuda.free           (0: free it now)

Rules (torch's ``CudaIPCTypes.cpp`` and ``reductions.py``, enforced the same way here):

1. **Counting.** Each handle counts 1 in the producer's counter file till let go (:func:`rebuild`).
2. **Limbo.** A block its producer lets go while counted is freed later, at 0 (:func:`collect`).
3. **Producer exit** with blocks still counted: a warning, and all is freed (:func:`_at_exit`).
4. **No re-sending** a received CUDA tensor (:func:`share`): ``CudaResendError``.
5. **Not to yourself:** getting back one's own CUDA tensor raises ``CudaSameProcessError``.
6. **Not after fork:** a forked child of a process that used CUDA cannot use it (``CudaForkError``).

Adapted from torch's ``CudaIPCSentData`` / ``CudaIPCSentDataLimbo`` / ``ipc_collect`` and
``rebuild_cuda_tensor``. Simplified: one block per storage; no collection on OOM (:func:`collect`).
"""
import os
import sys
import threading
import time
import weakref

from ..sharing import handles
from ..trace import recorder
from . import refcount
from .errors import CudaForkError, CudaHandleInvalidError, CudaResendError, CudaSameProcessError
from .storage import CudaStorage

WARNING = ("Producer process has been terminated before all shared CUDA tensors released. "
           "See Note [Sharing CUDA tensors]")


class _Sent:
    """A block this process owns: its memory, its counter slot once sent, and its state."""

    __slots__ = ("mem", "backend", "counter", "slot", "sends", "state", "allocated_ns")

    def __init__(self, mem, backend):
        self.mem, self.backend = mem, backend
        self.counter = self.slot = None
        self.sends = 0
        self.state = "live"          # live -> (limbo ->) freed
        self.allocated_ns = time.monotonic_ns()

    def count(self):
        return 0 if self.slot is None else refcount.read(self.counter.name, self.slot)


class _Received:
    """A block of another process that this process holds (one count in its producer's slot)."""

    __slots__ = ("mem", "storage", "producer", "counter", "slot")

    def __init__(self, mem, storage, producer, counter, slot):
        self.mem, self.storage, self.producer = mem, weakref.ref(storage), producer
        self.counter, self.slot = counter, slot


class _State:
    """Everything this process knows about CUDA IPC. Replaced (not shared) after fork."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.owned = {}         # block name -> _Sent
        self.received = {}      # block name -> _Received
        self.files = []         # this process's refcount.CounterFile s
        self.exit_hook = False
        self.exited = False
        self.used = False       # CUDA used here: a forked child may not use it
        self.warned = False


_state = _State()
_forked_from_user = False


def _after_fork_in_child():
    """Rule 6 of the module's list (this notes that the parent had used CUDA):

    6. **Not after fork.** A forked child of a process that used CUDA cannot use it
       (:class:`~mpviz.cuda.errors.CudaForkError`): use spawn."""
    global _state, _forked_from_user
    _forked_from_user = _forked_from_user or _state.used
    _state = _State()           # the parent's blocks are not ours; never free them from here
    refcount.forget_all()


os.register_at_fork(after_in_child=_after_fork_in_child)


def is_initialized():
    """Whether this process has used CUDA (see mpviz.cuda.is_initialized)."""
    return _state.used


def _begin(backend):
    """Checks and setup on the first CUDA use of this process."""
    if _forked_from_user:
        raise CudaForkError()
    st = _state
    st.used = True
    if not st.exit_hook:
        from multiprocessing import util
        # multiprocessing's children end with os._exit (fork) or skip atexit ordering; their
        # bootstrap runs util's exit finalizers. In the main process they run from atexit, after
        # the children have been joined (negative priority: the second pass).
        util.Finalize(None, _at_exit, exitpriority=-50)
        st.exit_hook = True
    return st


# -- the producer: allocate, send, let go --------------------------------------------------------

def allocate(backend, nbytes, device_index):
    """A new block (cudaMalloc), wrapped in a CudaStorage that frees it — or sends it to limbo."""
    st = _begin(backend)
    collect()
    mem = backend.allocate(nbytes, device_index)
    with st.lock:
        st.owned[mem.name] = _Sent(mem, backend)
    storage = CudaStorage(mem)
    f = weakref.finalize(storage, _producer_let_go, st, mem.name)
    f.atexit = False  # the exit hook frees what is left, in order
    if recorder.ENABLED:
        recorder.emit("cuda.alloc", block=mem.name, nbytes=nbytes, device=device_index, backend=backend.NAME)
    return storage


def share(storage):
    """Count one more handle to `storage`'s block and return what the consumer needs to open it.

    4. **No re-sending.** A received CUDA tensor cannot be sent on (its producer could not count the
       third process): :class:`~mpviz.cuda.errors.CudaResendError`, "Consider cloning before
       sending"."""
    if storage._received:
        raise CudaResendError(storage._sent_from, storage.block)
    st = _begin(None)
    with st.lock:
        rec = st.owned[storage.block]
        if rec.slot is None:
            rec.counter, rec.slot = _take_slot(st)
        count = refcount.add(rec.counter.name, rec.slot, +1)
        rec.sends += 1
        handle = rec.mem.export()
        event = rec.backend.record_event(rec.mem)
    handles.note_taken(_Taken(st, rec), None)    # a message that fails half-way gives it back
    if recorder.ENABLED:
        recorder.count_handle()  # the message being pickled carries one more handle
        recorder.emit("cuda.send", block=storage.block, nbytes=rec.mem.nbytes, count=count)
    return (rec.backend.NAME, handle, rec.mem.name, rec.mem.nbytes, rec.mem.device_index,
            os.getpid(), rec.counter.name, rec.slot, event)


class _Taken:
    """What one handle to a block took (a count in its slot, a send), for a message that fails
    to pickle half-way: ``handles.give_back`` calls ``decref()``, and no consumer is left
    counted that will never come (the producer would keep the block in limbo and warn at exit
    that consumers still hold it)."""

    def __init__(self, st, rec):
        self.st, self.rec = st, rec

    def decref(self):
        with self.st.lock:
            refcount.add(self.rec.counter.name, self.rec.slot, -1)
            self.rec.sends -= 1


def _take_slot(st):
    for f in st.files:
        if not f.unlinked:
            slot = f.take()
            if slot is not None:
                return f, slot
    f = refcount.CounterFile()
    st.files.append(f)
    return f, f.take()


def _producer_let_go(st, name):
    """The producer's storage died: free the block, or park it in limbo while it is counted."""
    if st is not _state or st.exited:
        return  # a forked child's copy of its parent's state, or exit freed it already
    with st.lock:
        rec = st.owned.get(name)
        if rec is None or rec.state != "live":
            return
        count = rec.count()
        if count > 0:
            rec.state = "limbo"
            if recorder.ENABLED:
                recorder.emit("cuda.limbo", block=name, nbytes=rec.mem.nbytes, count=count)
        else:
            _free(st, rec)
    collect()


def _free(st, rec, reason="released"):
    name = rec.mem.name
    rec.mem.free()
    rec.state = "freed"
    st.owned.pop(name, None)
    if rec.slot is not None:
        rec.counter.give_back(rec.slot)
        if rec.counter.in_use() == 0:
            rec.counter.unlink()  # leave nothing in /dev/shm while nothing is shared
            st.files.remove(rec.counter)
    if recorder.ENABLED:
        recorder.emit("cuda.free", block=name, nbytes=rec.mem.nbytes, reason=reason)


def collect():
    """Free every limbo block that no consumer holds any more; return how many were freed.

    The rule ("Limbo", rule 2 of the module's list):

    2. **Limbo.** When the producer's own code lets go of a block whose count is above 0, the block
       is not freed: it waits in limbo. Limbo is collected on every allocation and deletion, and by
       :func:`ipc_collect` — a block whose count reached 0 is freed then.

    Simplified from torch: one block per storage (torch shares the allocator's base block plus
    an offset); limbo is collected on allocation, deletion, ``ipc_collect`` and exit, not on
    out-of-memory."""
    st = _state
    freed = 0
    with st.lock:
        for rec in list(st.owned.values()):
            if rec.state == "limbo" and rec.count() <= 0:
                _free(st, rec)
                freed += 1
    return freed


# -- the consumer: open, hold, let go --------------------------------------------------------------

def rebuild(backend, handle, name, nbytes, device_index, producer, counter, slot, event):
    """Open a received handle (or find the block already open here) and return its storage.

    Rules 1 and 5 of the module's list, in full:

    1. **Counting.** Every handle the producer pickles adds 1 to the block's slot in its counter
       file (:mod:`mpviz.cuda.refcount`); a consumer keeps that 1 while it holds the block and
       subtracts it when its storage dies (or at once on a receive-cache hit) or when it exits.
    5. **Not to yourself.** Getting back one's own CUDA tensor from a queue raises
       :class:`~mpviz.cuda.errors.CudaSameProcessError` (torch: "will likely end up with
       segfault")."""
    st = _begin(backend)
    if producer == os.getpid():
        refcount.add(counter, slot, -1)  # the handle's count: nobody will hold it
        raise CudaSameProcessError(producer, name)
    with st.lock:
        rec = st.received.get(name)
        storage = rec.storage() if rec is not None else None
        if storage is not None:
            refcount.add(counter, slot, -1)  # we hold it once already: this handle's count goes
            return storage
        try:
            mem = backend.open_handle(handle, nbytes, device_index, name)
        except (FileNotFoundError, RuntimeError) as e:
            if isinstance(e, RuntimeError) and "invalid" not in str(e).lower():
                raise
            try:
                refcount.add(counter, slot, -1)
            except FileNotFoundError:
                pass
            raise CudaHandleInvalidError(producer, name) from None
        backend.wait_event(event)
        try:
            refcount.mapping(counter)  # map the producer's counters now, while they exist
        except FileNotFoundError:
            pass
        storage = CudaStorage(mem, producer_pid=producer)
        st.received[name] = _Received(mem, storage, producer, counter, slot)
    f = weakref.finalize(storage, _consumer_let_go, st, name)
    f.atexit = False
    if recorder.ENABLED:
        recorder.emit("cuda.ipc_open", block=name, nbytes=nbytes, producer=producer,
                      count=refcount.read(counter, slot))
    return storage


def _consumer_let_go(st, name):
    if st is not _state:
        return
    with st.lock:
        rec = st.received.pop(name, None)
        if rec is None:
            return
        rec.mem.close()
        count = refcount.add(rec.counter, rec.slot, -1)
    if recorder.ENABLED:
        recorder.emit("cuda.ipc_close", block=name, producer=rec.producer, count=count)


# -- exit -------------------------------------------------------------------------------------------

def _at_exit():
    """Rule 3 of the module's list, in full:

    3. **Producer exit.** At exit, a producer whose blocks are still counted prints (stderr, once)
       ``Producer process has been terminated before all shared CUDA tensors released`` and frees
       everything anyway (a process's device memory dies with it); consumers still mapping a block
       now read poison. It does not wait: a consumer that is itself about to exit is still too late
       (the seed's bad-practice example, where both sleep 2 s, warns here every time). torch also
       warns when no consumer holds the block any more (a false alarm users report; what torch did,
       run by run: docs/PERFORMANCE.md); mpviz warns only while a consumer holds a block."""
    st = _state
    if st.exited or st.pid != os.getpid():
        return
    for name in list(st.received):  # a consumer's memory is released when it exits
        _consumer_let_go(st, name)
    held = _still_held(st)
    with st.lock:
        st.exited = True
        if held and not st.warned:
            st.warned = True
            print(f"[W CudaIPCTypes.cpp] {WARNING}\n"
                  f"[mpviz.cuda] process {os.getpid()} exits while consumers still hold "
                  f"{len(held)} of its CUDA block(s) ({', '.join(r.mem.name for r in held)}); their "
                  f"memory is freed now, so what those consumers read is invalid. Fix: consumers "
                  f"`del` received tensors as soon as they are done, and the producer waits (e.g. "
                  f"on an Event the consumers set) before it exits.", file=sys.stderr, flush=True)
            if recorder.ENABLED:
                recorder.emit("cuda.warning", message=WARNING, blocks=[r.mem.name for r in held])
        for rec in list(st.owned.values()):
            _free(st, rec, reason="exit")
        for f in list(st.files):
            f.unlink()
        st.files.clear()


def _still_held(st):
    collect()
    with st.lock:
        return [r for r in st.owned.values() if r.slot is not None and r.count() > 0]


# -- what the pictures and the scenarios look at -------------------------------------------------

def stats():
    st = _state
    with st.lock:
        owned = [{"block": r.mem.name, "nbytes": r.mem.nbytes, "device": r.mem.device_index,
                  "state": r.state, "refcount": r.count(), "sends": r.sends,
                  "counter": None if r.slot is None else (r.counter.name, r.slot)}
                 for r in st.owned.values()]
        received = [{"block": name, "nbytes": r.mem.nbytes, "producer": r.producer,
                     "refcount": _safe_read(r.counter, r.slot), "valid": r.mem.is_valid(),
                     "producer_alive": _alive(r.producer)}
                    for name, r in st.received.items()]
    return {
        "pid": os.getpid(),
        "allocated": owned,
        "received": received,
        "allocated_bytes": sum(b["nbytes"] for b in owned),
        "held_for_consumers_bytes": sum(b["nbytes"] for b in owned if b["refcount"] > 0),
        "limbo_blocks": sum(1 for b in owned if b["state"] == "limbo"),
        "limbo_bytes": sum(b["nbytes"] for b in owned if b["state"] == "limbo"),
        "received_bytes": sum(b["nbytes"] for b in received),
    }


def _safe_read(counter, slot):
    try:
        return refcount.read(counter, slot)
    except OSError:
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
