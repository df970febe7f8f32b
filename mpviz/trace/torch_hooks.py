"""Seeing real torch share memory: hooks into torch 2.13's own sharing code, installed when the
recorded program imports torch.

mpviz's own sharing (mpviz.sharing) records its events itself. Real torch does the same things in
its own code -- mostly C++ -- so we watch the few Python functions that every tensor crossing a
process boundary goes through (torch/multiprocessing/reductions.py, torch/storage.py)::

    sender (the thread that pickles: a Queue's feeder, Connection.send, SimpleQueue.put)
      reduce_storage(storage)                      registered on multiprocessing's ForkingPickler
        storage._share_fd_cpu_()        ─► shm.create + copy   (only if the bytes move into shm)
        or storage._share_filename_cpu_()  (file_system: the first one starts torch_shm_manager:
                                            process.launch, so it gets a lane)
      ─► shm.handle {name, strategy, nbytes, via, token}     this message carries a handle
         (resource_sharer's _serve thread, later: fd.send {token} when the receiver asks for it)
    receiver (while it unpickles)
      rebuild_storage_fd(cls, df, size)   df.detach(): fd.recv {token, request_ns, request_nbytes}
                                          (_ask: the request to _serve); then shm.attach, or
      rebuild_storage_filename(...)       shm.cache {hit: True} when torch's shared_cache had it
    ... and the rest of what is hooked: install()

Every event says ``torch=True``. Names are torch's own: ``/torch_<pid>_<rand>_<n>``, the name
/proc/PID/maps shows under /dev/shm (file_descriptor segments show it "(deleted)": torch unlinks
the name at once and keeps the fd). What is *not* seen: when torch unmaps a segment (looked for
instead: ``_mapped_now``) or the manager unlinks it (C++ with no Python on the way), so a torch
segment is never drawn as leaked or freed by us; the pictures say "unlink not seen (torch)".
"""
import functools
import hashlib
import importlib.abc
import os
import sys
import threading
import time
from multiprocessing import connection, process, reduction
from multiprocessing.context import get_spawning_popen as _spawning_popen
from multiprocessing.reduction import ForkingPickler

from .. import _proc
from . import recorder
from .events import queue_id

SUPPORTED = "2.13"
_installed = False
_disabled = None                  # why recording torch's sharing stopped, or None
_sizes = {}                       # segment name -> nbytes, for segments this process knows
_managers = set()                 # torch_shm_manager socket paths seen by this process
_here = threading.local()         # .handle: (name, strategy, nbytes) of the last share call
_mine = {}                        # name -> (strategy, StorageWeakRef or None): torch segments
                                  # this process maps, as far as this recording knows
_mine_for = [None]                # (pid, trace directory): the recording _mine belongs to
_looked = [0, 0.0]                # segments mapped since the last look; when /proc was last read
LOOK_EVERY, READ_MAPS_EVERY_S = 8, 1.0
_orig = {}
_fd_names = {}                    # fd -> (st_dev, st_ino, segment name): _fd_name's cache
_R = None                         # torch.multiprocessing.reductions, once install() has run
_strategy = None                  # torch.multiprocessing.get_sharing_strategy, the same
_worker_info = None               # torch.utils.data.get_worker_info, the same
_expired = None                   # torch.Storage._expired: StorageWeakRef.expired without its
                                  # call (a sweep asks it of every segment it knows)


# --- installing: when (and if) the program imports torch ---------------------------------------

class _TorchFinder(importlib.abc.MetaPathFinder):
    """Waits on sys.meta_path for ``import torch``; once torch has run, installs the hooks."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or _installed:
            return None
        sys.meta_path.remove(self)               # find the real spec, without us in the way
        try:
            import importlib.util
            spec = importlib.util.find_spec("torch")
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)                          # torch itself first: our hooks need all of it
            _install_safely()
        spec.loader.exec_module = exec_module
        return spec


def watch():
    """Hook torch's sharing now if torch is imported already, else as soon as it is."""
    if _installed:
        return
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "multiprocessing"):
        _install_safely()
    elif not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())


def _install_safely():
    try:
        install()
    except Exception as exc:
        _disable(f"installing the hooks failed ({type(exc).__name__}: {exc})")


def install():
    """Check the version, then wrap torch's sharing functions (once per process).

    Besides the sender and receiver of the module's picture, these are hooked::

        Tensor.share_memory_(), Module.share_memory()  ─► shm.create + copy (via="share_memory_")
        a CUDA tensor: reduce_tensor's CUDA branch ─► cuda.send {block, nbytes} (an IPC handle)
          rebuild_cuda_tensor, in the receiver   ─► cuda.ipc_open {block} (unless torch's cache has it)
        a DataLoader worker's collate             ─► shm.create (via="_new_shared") + copy (via=
                                                     "collate"): the samples are copied into a new
                                                     segment, which the batch then is
        a forked child                            ─► shm.attach (how="fork") for every torch segment
                                                     it inherits (read from /proc/self/maps)
        DataLoader's _worker_loop                 ─► dataloader.worker {phase: start/exit, worker_id,
                                                     data_queue (at start: the queue it puts into)}
        DataLoader's _pin_memory_loop (a thread)  ─► dataloader.pin_memory {phase: start/exit}, and
          pin_memory(batch), in it                ─► dataloader.pin {tensors, nbytes} per batch
        DataLoader(pin_memory=True) with no accelerator (a CPU-only torch: torch warns and pins
                                                     nothing) ─► dataloader.pin_memory {phase: skipped}

    Only torch 2.13 is hooked: these are private functions that change between versions. Another
    version gets a ``torch.unsupported`` event and a line on stderr saying torch's sharing is NOT
    recorded -- so that the summary can say "unknown", never "0 segments". A hook that raises turns
    itself off the same way (``torch.hook_failed``); the user's call always runs, exactly once. The
    hooks stay in place after ``record()`` ends (torch's pickler table holds them): while nothing
    records, each is one check and then torch's own function.
    """
    global _installed
    if _installed:
        return
    _installed = True
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchFinder)]
    import torch
    version = str(getattr(torch, "__version__", "unknown"))
    if not version_supported(version):
        _unsupported(version)
        return
    from multiprocessing import resource_sharer

    import torch.multiprocessing.reductions as R
    from torch.utils.data import dataloader
    from torch.utils.data._utils import pin_memory, worker

    global _R, _strategy, _worker_info, _expired
    _R = R                                       # (the hooks below run per tensor: no import)
    _strategy, _worker_info = torch.multiprocessing.get_sharing_strategy, dataloader.get_worker_info
    _expired = torch.Storage._expired
    recorder._install_fork_hooks()               # the recorder's child log opens before ours runs
    _wrap_method(torch.UntypedStorage, "_share_fd_cpu_", _share_fd)
    _wrap_method(torch.UntypedStorage, "_share_filename_cpu_", _share_filename)
    _wrap_method(torch.UntypedStorage, "_new_shared", _new_shared, classmethod_=True)
    _wrap_method(torch.nn.Module, "share_memory", _module_share_memory)
    # The pickler's table holds the function objects themselves: replace them there too.
    _wrap_function(R, "reduce_storage", _reduce_storage)
    _wrap_function(R, "reduce_tensor", _reduce_tensor)        # (for its CUDA branch)
    table = reduction.ForkingPickler._extra_reducers
    for cls, reducer in list(table.items()):
        for name in ("reduce_storage", "reduce_tensor"):
            if reducer is _orig[name]:
                table[cls] = getattr(R, name)
    # The rebuild functions travel by name (module + qualname): the wrappers keep torch's, so a
    # receiver that is not recorded still finds torch's own.
    _wrap_function(R, "rebuild_storage_fd", _rebuild_storage_fd)
    _wrap_function(R, "rebuild_storage_filename", _rebuild_storage_filename)
    _wrap_function(R, "rebuild_cuda_tensor", _rebuild_cuda_tensor)
    _wrap_function(worker, "_worker_loop", _worker_loop)
    # DataLoader(pin_memory=True): the thread (looked up by DataLoader at each iter()), the
    # function it pins each batch with (looked up by name, recursively: the outer call counts),
    # and the iterator that decides whether there is anything to pin with at all
    _wrap_function(pin_memory, "_pin_memory_loop", _pin_memory_loop)
    _wrap_function(pin_memory, "pin_memory", _pin_batch)
    _wrap_method(dataloader._BaseDataLoaderIter, "__init__", _loader_iter_init)
    _watch_distributed(torch)
    sharer = resource_sharer._resource_sharer
    _orig["register"] = sharer.register
    sharer.register = _register
    os.register_at_fork(after_in_child=_inherited_by_fork)


def _watch_distributed(torch):
    """torch.distributed's rendezvous and collectives: dist_hooks.py (when torch has it)."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not getattr(dist, "is_available", lambda: False)():
        return
    from . import dist_hooks
    try:
        dist_hooks.install(torch)
    except Exception as exc:             # torch's sharing is still recorded: say what is not
        why = f"hooking it failed ({type(exc).__name__}: {exc})"
        print(f"mpviz.trace: torch.distributed is NOT recorded in pid {os.getpid()}: {why}",
              file=sys.stderr)
        if recorder.ENABLED:
            recorder.emit("not_recorded", what="torch.distributed", why=why,
                          fix="use torch " + SUPPORTED, torch=True)


def version_supported(version):
    """True for the torch versions whose private sharing functions these hooks know."""
    return version == SUPPORTED or version.startswith(SUPPORTED + ".") or \
        version.startswith(SUPPORTED + "+")


def _unsupported(version):
    global _disabled
    _disabled = f"torch {version} is not supported (mpviz hooks torch {SUPPORTED})"
    _say("torch.unsupported", version=version, supported=SUPPORTED)


def _disable(why):
    """Stop recording torch's sharing in this process, and say so once (event + stderr)."""
    global _disabled
    if _disabled is None:
        _disabled = why
        _say("torch.hook_failed", error=why)


def _say(kind, **args):
    text = (f"mpviz.trace: torch's shared memory is NOT recorded in pid {os.getpid()}: "
            f"{_disabled}. Segments, copies and handles of torch tensors are missing from this "
            f"trace (unknown, not zero). Fix: use torch {SUPPORTED}, or read /proc/PID/maps.")
    print(text, file=sys.stderr)
    if recorder.ENABLED:
        recorder.emit(kind, reason=_disabled, torch=True, **args)
    # A forked child has this torch too and is just as blind: its log says so as well (the
    # recorder's own at-fork hook, registered before this one, has opened that log by then).
    # Its stderr stays quiet: the parent's line covers it.
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: recorder.emit(kind, reason=_disabled,
                                                                 torch=True, **args))


def _wrap_method(cls, name, hook, classmethod_=False):
    original = getattr(cls, name)                # (bound to cls, for a classmethod)
    _orig[name] = original

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)
    setattr(cls, name, classmethod(lambda c, *a, **k: hook(original, *a, **k))
            if classmethod_ else wrapper)


def _wrap_function(module, name, hook):
    original = getattr(module, name)
    _orig[name] = original

    @functools.wraps(original)                  # same __module__/__qualname__: pickles as torch's
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)
    setattr(module, name, wrapper)


def _on():
    return recorder.ENABLED and _disabled is None


def _guard(step, *args):
    """Run one of our own steps and return its result; if it raises, turn the hooks off and
    return None (the user's call runs either way, exactly once)."""
    try:
        return step(*args)
    except Exception as exc:
        _disable(f"{getattr(step, '__name__', step)} raised {type(exc).__name__}: {exc}")
        return None


# --- the sender: moving bytes into shared memory, and the handle ---------------------------------

def _share_fd(original, storage):
    was_shared = _on() and _guard(storage.is_shared)
    result = original(storage)                   # (fd, nbytes); the move happens here, in C++
    if _on():
        _guard(_shared, storage, "file_descriptor", result[0], result[1], was_shared)
    return result


def _share_filename(original, storage):
    was_shared = _on() and _guard(storage.is_shared)
    result = original(storage)                   # (manager socket, b"/torch_...", nbytes)
    if _on():
        _guard(_shared, storage, "file_system", result[1], result[2], was_shared)
        _guard(_manager_seen, result[0])
    return result


def _shared(storage, strategy, handle, nbytes, was_shared):
    """`handle`: the fd (file_descriptor) or the name (file_system) torch returned."""
    name = _fd_name(handle) if strategy == "file_descriptor" else handle.decode()
    _here.handle = (name, strategy, nbytes)
    if not was_shared:                           # the bytes moved: a new segment, one copy
        _sizes[name] = nbytes
        _mapped_now(name, strategy, storage)
        via = "reduce_storage" if getattr(_here, "reducing", False) else "share_memory_"
        recorder.emit("shm.create", name=name, strategy=strategy, nbytes=nbytes, via=via,
                      torch=True)
        recorder.emit("copy", name=name, strategy=strategy, nbytes=nbytes, via=via, torch=True)


def _fd_name(fd, st=None):
    """torch's name of the segment behind `fd`: /dev/shm/torch_1_2_3 (deleted) -> /torch_1_2_3.

    Linux says it in /proc/self/fd/N (a readlink: ~10 us); a sender asks twice for one segment
    (made, then pickled), so the answer is kept per fd number with the file's identity,
    ``(st_dev, st_ino)`` from `st` (``os.fstat(fd)``, ~1 us): an fd closed and its number reused,
    or another file dup2'd onto it, is another file, and is read again. (tmpfs, and so memfd,
    numbers its inodes from a counter: a closed file's number comes back only when the counter
    wraps, never at the next file -- unlike ext4. And a torch segment's name never changes.)"""
    st = os.fstat(fd) if st is None else st
    known = _fd_names.get(fd)
    if known is not None and known[0] == st.st_dev and known[1] == st.st_ino:
        return known[2]
    name = os.readlink(f"/proc/self/fd/{fd}").removeprefix("/dev/shm").removesuffix(" (deleted)")
    _fd_names[fd] = (st.st_dev, st.st_ino, name)
    return name


def _new_shared(original, size, **kwargs):
    storage = original(size, **kwargs)           # made in shared memory: nothing is copied
    if _on() and storage.device.type == "cpu":
        _guard(_created_shared, storage)
    return storage


def _created_shared(storage):
    if _strategy() == "file_system":
        _, name, nbytes = _orig["_share_filename_cpu_"](storage)
        name, strategy = name.decode(), "file_system"
    else:
        fd, nbytes = _orig["_share_fd_cpu_"](storage)
        name, strategy = _fd_name(fd), "file_descriptor"
    _sizes[name] = nbytes
    _mapped_now(name, strategy, storage)
    recorder.emit("shm.create", name=name, strategy=strategy, nbytes=nbytes, via="_new_shared",
                  torch=True)
    if _worker_info() is not None:     # a DataLoader worker's collate: stack(samples, out=this)
        recorder.emit("copy", name=name, strategy=strategy, nbytes=nbytes, via="collate",
                      torch=True)


def _module_share_memory(original, module):
    result = original(module)
    if _on():
        _guard(_module_shared, module)
    return result


def _module_shared(module):
    tensors = list(module.parameters()) + list(module.buffers())
    recorder.emit("torch.share_memory", module=type(module).__name__, tensors=len(tensors),
                  nbytes=sum(t.untyped_storage().nbytes() for t in tensors), torch=True)


def _reduce_storage(original, storage):
    _here.reducing, _here.handle = True, None
    try:
        result = original(storage)
    finally:
        _here.reducing = False
    if _on() and _here.handle is not None:       # (None: an empty storage, nothing shared)
        _guard(_handle_sent, result)
    return result


def _handle_sent(result):
    """Say that the message being pickled in this thread carries a handle: the next message
    event of this thread (queue.feed, pipe.send, queue.put) is that message (analysis.py)."""
    name, strategy, nbytes = _here.handle
    df = result[1][1] if strategy == "file_descriptor" else None
    token = _token(getattr(df, "_id", None))
    via = ("process start" if _spawning_popen() is not None else
           "resource_sharer" if token is not None else "name")
    recorder.count_handle()        # the message (or a Process's arguments) carries one more
    recorder.emit("shm.handle", name=name, strategy=strategy, nbytes=nbytes, via=via,
                  token=token, torch=True)
    if token is not None:
        _tokens[token] = name


_tokens = {}                       # resource_sharer token -> segment name (this process's offers)


def _token(ident):
    """resource_sharer's id of an fd on offer, ``(address, key)``, as one string."""
    return None if ident is None else f"{ident[0]}#{ident[1]}"


def _register(send, close):
    """resource_sharer.register, watched: its _serve thread records the fd it hands over."""
    box = []

    def traced_send(conn, pid):
        if _on() and box and box[0] in _tokens:     # (not a socket or fd of someone else's)
            _guard(_fd_sent, box[0], pid)
        return send(conn, pid)
    ident = _orig["register"](traced_send, close)
    box.append(_token(ident))
    return ident


def _fd_sent(token, pid):
    name = _tokens.pop(token, None)
    recorder.emit("fd.send", name=name, token=token, peer=pid, via="resource_sharer",
                  nbytes=_sizes.get(name), torch=True)


def _manager_seen(path):
    """The first file_system share of this process talks to a torch_shm_manager: if this process
    started it (its parent), give it a lane (it records nothing itself: it is not Python)."""
    if path in _managers:
        return
    _managers.add(path)
    for pid in _proc.pids():
        if not (_proc.cmdline(pid) or b"").startswith(b"torch_shm_manager"):
            continue                       # (None: gone, or not ours)
        st = _proc.stat(pid)
        if st is not None and st.ppid == os.getpid():
            recorder.emit("process.launch", child=pid, name="torch_shm_manager",
                          start_method="exec (torch)", socket=path.decode(), torch=True)


# --- the receiver: rebuilding a storage from a handle ---------------------------------------------

class _WatchedFd:
    """Stands in for the handle's DupFd: its detach() (the fd fetched from the sender's
    resource_sharer, or inherited at process start) is recorded as fd.recv."""

    def __init__(self, df):
        self.df = df

    def detach(self):
        ident = getattr(self.df, "_id", None)
        if ident is None or not _on():
            fd, request = self.df.detach(), None
        else:
            fd, request = _ask(ident)
        if _on():
            _guard(_fd_received, self.df, fd, request)
        return fd


def _ask(ident):
    """resource_sharer's ``DupFd.detach``, in the stdlib's own steps (``get_connection``): connect
    to the sender's ``_serve`` thread, send it the request ``(key, pid)``, receive the fd. The
    request goes as the stdlib's ``Connection.send`` would send it -- its pickled bytes, with
    no mpviz envelope -- so it is not a message of the trace (no pipe.send/pipe.recv, and
    ``_serve`` unpickles no envelope before it answers): the fd.recv says when it was sent and
    its size, and the fd.send says when ``_serve`` answered it. Returns (fd, (sent at, nbytes))."""
    address, key = ident
    with connection.Client(address, authkey=process.current_process().authkey) as conn:
        data = ForkingPickler.dumps((key, os.getpid()))
        asked_ns = time.monotonic_ns()
        conn.send_bytes(data)
        return reduction.recv_handle(conn), (asked_ns, len(data))


def _fd_received(df, fd, request):
    st = os.fstat(fd)                            # (one fstat for the name, the key, the size)
    name = _fd_name(fd, st)
    token = _token(getattr(df, "_id", None))
    # torch looks in its shared_cache by the fd's (inode, device) next -- reductions.fd_id(fd):
    # a hit maps nothing new
    _here.received = (name, _cached((st.st_ino, st.st_dev)))
    asked = {} if request is None else {"request_ns": request[0], "request_nbytes": request[1]}
    recorder.emit("fd.recv", name=name, token=token, via="resource_sharer" if token else
                  "process start", nbytes=st.st_size, torch=True, **asked)


def _cached(key):
    """Whether torch's receive cache holds a live storage for `key` (what rebuild asks first)."""
    ref = _R.shared_cache.get(key)
    return ref is not None and _R.torch.UntypedStorage._new_with_weak_ptr(ref.cdata) is not None


def _rebuild_storage_fd(original, cls, df, size):
    _here.received = None
    storage = original(cls, _WatchedFd(df), size)
    if _on() and _here.received is not None:
        name, hit = _here.received
        _guard(_mapped, name, "file_descriptor", storage, hit)
    return storage


def _rebuild_storage_filename(original, cls, manager, handle, size, dtype=None):
    hit = _on() and _guard(_cached, handle)
    storage = original(cls, manager, handle, size, dtype)
    if _on():
        _guard(_mapped, handle.decode(), "file_system", storage, hit)
    return storage


def _hooks():
    """mpviz.trace.hooks (imported here, not at the top: it installs this module)."""
    global _hooks_module
    if _hooks_module is None:
        from . import hooks
        _hooks_module = hooks
    return _hooks_module


_hooks_module = None


def _mapped(name, strategy, storage, hit):
    nbytes = storage.nbytes()
    if hit:
        recorder.emit("shm.cache", hit=True, name=name, strategy=strategy, nbytes=nbytes,
                      torch=True)
    else:
        _sizes[name] = nbytes
        _mapped_now(name, strategy, storage)
        recorder.emit("shm.attach", name=name, strategy=strategy, nbytes=nbytes, torch=True)
    _hooks().received_at_start()   # a spawned child unpickling its arguments: one handle more


# --- CUDA tensors: an IPC handle to GPU memory travels, never the bytes ---------------------------
#
# reduce_tensor's CUDA branch asks the storage for its IPC handle (storage._share_cuda_(): the
# cudaIpcMemHandle of the whole cudaMalloc block, the storage's offset in it, a reference counter
# in a shared file, an event) and returns (rebuild_cuda_tensor, args). The receiver's
# rebuild_cuda_tensor opens the handle (cudaIpcOpenMemHandle) unless torch's shared_cache has it
# already. The same kinds as mpviz's CUDA simulator (mpviz.cuda.ipc): cuda.send when a handle is
# pickled, cuda.ipc_open when a receiver opens one. The block is named by the handle's bytes
# and the offset (what torch's cache keys it by). Not seen: torch's reference counts (kept in
# C++), the close, and a cache hit (no new open: nothing is recorded).

# rebuild_cuda_tensor's arguments, in order (reduce_tensor builds them; torch 2.13)
_CUDA_ARGS = ("tensor_cls", "tensor_size", "tensor_stride", "tensor_offset", "storage_cls",
              "dtype", "storage_device", "storage_handle", "storage_size_bytes",
              "storage_offset_bytes", "requires_grad", "ref_counter_handle",
              "ref_counter_offset", "event_handle", "event_sync_required")


def _reduce_tensor(original, tensor):
    result = original(tensor)
    if _on() and result[0] is _R.rebuild_cuda_tensor:      # (the CPU branch: reduce_storage)
        _guard(_cuda_sent, dict(zip(_CUDA_ARGS, result[1])))
    return result


def _cuda_block(args):
    """One name for a CUDA storage, the same in sender and receiver: device, handle, offset.
    The IPC handle is 64 opaque bytes, and two blocks' handles may share a long prefix, so the
    name takes a digest of all of them (12 hex digits: short enough to draw)."""
    handle = args["storage_handle"]
    handle = bytes(handle) if isinstance(handle, (bytes, bytearray)) else str(handle).encode()
    digest = hashlib.blake2b(handle, digest_size=6).hexdigest()
    return f"cuda:{args['storage_device']}/{digest}+{args['storage_offset_bytes']}"


def _cuda_sent(args):
    if args["storage_handle"] is None or not args["storage_size_bytes"]:
        return                                   # an empty storage: no handle, nothing shared
    recorder.count_handle()        # the message (or a Process's arguments) carries one more
    recorder.emit("cuda.send", block=_cuda_block(args), nbytes=args["storage_size_bytes"],
                  device=args["storage_device"], torch=True)


def _rebuild_cuda_tensor(original, *args, **kwargs):
    named = dict(zip(_CUDA_ARGS, args), **kwargs)
    opens = _on() and _guard(_cuda_opens, named)
    tensor = original(*args, **kwargs)
    if opens and _on():
        recorder.emit("cuda.ipc_open", block=_cuda_block(named),
                      nbytes=named["storage_size_bytes"], device=named["storage_device"],
                      torch=True)
        _hooks().received_at_start()
    return tensor


def _cuda_opens(args):
    """Whether rebuild_cuda_tensor will open the handle (not empty, not in torch's cache)."""
    import torch.multiprocessing.reductions as R
    if args.get("storage_handle") is None or not args.get("storage_size_bytes"):
        return False
    key = (args["storage_handle"], args["storage_offset_bytes"])
    return R.storage_from_cache(args["storage_cls"], key) is None


# --- fork, and DataLoader workers -----------------------------------------------------------------

def _inherited_by_fork():
    """A forked child maps whatever its parent mapped: say so for torch's segments."""
    if not _on():
        return
    _guard(_scan_maps)


def _scan_maps():
    seen, mine = set(), _known()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[-1]
            if not path.startswith("/dev/shm/torch_"):
                continue
            deleted = path.endswith(" (deleted)")
            name = path.removeprefix("/dev/shm").removesuffix(" (deleted)")
            if name in seen:
                continue
            seen.add(name)
            mine[name] = ("file_descriptor" if deleted else "file_system", None)
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            recorder.emit("shm.attach", name=name, how="fork", torch=True,
                          strategy="file_descriptor" if deleted else "file_system",
                          nbytes=_sizes.get(name, hi - lo))


# --- torch's unmaps, looked for -----------------------------------------------------------------
#
# Each process keeps the torch segments it mapped, with a weak reference to the storage that maps
# each, and after every 8 more it looks: a storage torch has freed is unmapped (``shm.detach``
# how="storage freed"); when the process leaves ``_bootstrap``, and at most once a second while
# it knows a segment with no storage to ask (one a fork inherited), it reads what Linux says,
# /proc/self/maps (~0.5 ms of CPU in a torch process; read every second whatever it knew, it
# was ~0.1 s of a 10,000-batch DataLoader run's 9 processes), and a segment gone from there is
# unmapped too (how="/proc/self/maps"). So the memory map counts what was really mapped, to
# within the 8 not looked at yet -- not every segment the run ever made (a loop that sends
# 10,000 tensors maps a few at a time).
#
# What a process "maps, as far as we know" belongs to one recording: a second ``record()`` in the
# same kernel, a forked child (its own log), a resumed outer recording each start from nothing,
# so that no trace lists as let go a segment it never saw mapped (the first recording's, freed
# since). A segment mapped before is then not seen let go: "in use, unless torch has let go".

def _known():
    """_mine, emptied first when the recording (this process, its trace directory) is new."""
    now = (os.getpid(), recorder.current_directory())
    if _mine_for[0] != now:
        _mine.clear()
        _looked[0] = 0
        _mine_for[0] = now
    return _mine


def _mapped_now(name, strategy, storage=None):
    """This process maps torch segment `name` now (through `storage`); every LOOK_EVERY such
    (more when it maps many at once: the look is then as cheap per segment), look which of them
    torch has let go of."""
    _known()[name] = (strategy, _R.StorageWeakRef(storage) if storage is not None else None)
    _looked[0] += 1
    if _looked[0] >= max(LOOK_EVERY, len(_mine) // 4):
        _looked[0] = 0
        if time.monotonic() - _looked[1] >= READ_MAPS_EVERY_S and \
                any(ref is None for _, ref in _mine.values()):
            _look_at_maps()
        else:
            _sweep_freed()


def _sweep_freed():
    """A segment whose storage torch has freed is unmapped (torch unmaps as it frees, in C++):
    its ``shm.detach`` now. (A weak reference to torch's storage: ~0.5 us to ask, where reading
    /proc/self/maps costs ~0.5 ms; /proc is read too, every READ_MAPS_EVERY_S while a segment
    has no storage to ask, and at the process's end, as the truth.)"""
    gone = _expired
    for name in [n for n, (_, ref) in _mine.items() if ref is not None and gone(ref.cdata)]:
        strategy, _ = _mine.pop(name)
        recorder.emit("shm.detach", name=name, strategy=strategy, nbytes=_sizes.get(name),
                      how="storage freed", torch=True)


def _look_at_maps():
    """Read /proc/self/maps; every segment of ours not there any more was unmapped by torch
    (in C++, unseen) since the last look: record its ``shm.detach`` now."""
    _looked[0], _looked[1] = 0, time.monotonic()
    if not _mine:
        return
    there = set()
    with open("/proc/self/maps") as f:
        for line in f:
            at = line.find("/dev/shm/torch_")
            if at != -1:
                there.add(line[at + 8:].rstrip("\n").removesuffix(" (deleted)"))
    for name in [n for n in _mine if n not in there]:
        strategy, _ = _mine.pop(name)
        recorder.emit("shm.detach", name=name, strategy=strategy, nbytes=_sizes.get(name),
                      how="/proc/self/maps", torch=True)


def looked_at_exit():
    """A process leaving _bootstrap (hooks.py): what it still maps, as Linux says."""
    if _on() and _known():
        _guard(_look_at_maps)


def _worker_loop(original, *args, **kwargs):
    worker_id, num_workers = _worker_ids(args, kwargs)
    if _on():
        recorder.emit("dataloader.worker", phase="start", worker_id=worker_id,
                      num_workers=num_workers, data_queue=_data_queue_id(args, kwargs),
                      torch=True)
    try:
        return original(*args, **kwargs)
    finally:
        if _on():
            recorder.emit("dataloader.worker", phase="exit", worker_id=worker_id, torch=True)


def _pin_memory_loop(original, in_queue, out_queue, device_id, *args, **kwargs):
    # _pin_memory_loop(in_queue, out_queue, device_id, done_event, device): a thread of the
    # main process that takes each batch from the workers, pins it, passes it on
    if _on():
        recorder.emit("dataloader.pin_memory", phase="start", device_id=device_id, torch=True)
    try:
        return original(in_queue, out_queue, device_id, *args, **kwargs)
    finally:
        if _on():
            recorder.emit("dataloader.pin_memory", phase="exit", device_id=device_id,
                          torch=True)


def _pin_batch(original, data, device=None):
    """torch's pin_memory(data, device), which calls itself for each part of a batch: only the
    outermost call (the whole batch) is recorded, after it has copied into pinned memory."""
    if getattr(_here, "pinning", False) or not _on():
        return original(data, device)
    _here.pinning = True
    try:
        pinned = original(data, device)
    finally:
        _here.pinning = False
    if _on():
        _guard(_batch_pinned, pinned, device)
    return pinned


def _batch_pinned(batch, device):
    tensors = list(_tensors_in(batch))
    recorder.emit("dataloader.pin", tensors=len(tensors), device=device,
                  nbytes=sum(t.nbytes for t in tensors), torch=True)


def _tensors_in(data):
    """The tensors of a batch (a tensor, or dicts, lists and tuples of them)."""
    import torch
    if isinstance(data, torch.Tensor):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from _tensors_in(value)
    elif isinstance(data, (list, tuple)):
        for value in data:
            yield from _tensors_in(value)


def _loader_iter_init(original, it, loader, *args, **kwargs):
    result = original(it, loader, *args, **kwargs)
    # torch turns pin_memory=True off when there is no accelerator (a CPU-only torch): it warns
    # "device pinned memory won't be used", starts no pin-memory thread, and pins nothing
    if _on() and getattr(loader, "pin_memory", False) and not getattr(it, "_pin_memory", True):
        recorder.emit("dataloader.pin_memory", phase="skipped", torch=True,
                      reason="pin_memory=True but torch found no accelerator: no pin-memory "
                             "thread, nothing pinned (torch warned so)")
    return result


def _data_queue_id(args, kwargs):
    """The id of the queue this worker puts its batches into (the main process gets from it:
    while none came, the wait-for graph says who must put), or None."""
    q = kwargs.get("data_queue", args[3] if len(args) > 3 else None)
    try:
        return queue_id(q)
    except AttributeError:                 # not a multiprocessing Queue (a torch we do not know)
        return None


def _worker_ids(args, kwargs):
    # _worker_loop(dataset_kind, dataset, index_queue, data_queue, done_event, auto_collation,
    #              collate_fn, drop_last, base_seed, init_fn, worker_id, num_workers, ...)
    worker_id = kwargs.get("worker_id", args[10] if len(args) > 10 else None)
    num_workers = kwargs.get("num_workers", args[11] if len(args) > 11 else None)
    return worker_id, num_workers
