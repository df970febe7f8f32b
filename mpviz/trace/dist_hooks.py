"""Seeing torch.distributed: its rendezvous and collectives, recorded in torch 2.13's Python.

Every collective of torch.distributed passes through one Python function of
torch/distributed/distributed_c10d.py before its C++ backend (gloo) moves the bytes. Each rank
wraps those functions, so each call is two events in that rank's log::

    rank 0:  dist.all_reduce(t)  ─► dist.collective {phase: begin, op: all_reduce, seq: 3,
                                                     group: [0, 1], rank: 0, nbytes: 400}
             ... gloo waits for rank 1, sends and receives (C++ threads: not seen) ...
                                  ─► dist.collective {phase: end, ..., error: None}
    rank 1:  the same op, the same seq: the pictures join the two (who arrived when, who waited)

``seq`` counts the collectives this rank called on that group, from 1 (the outermost call
only: all_gather_object is one): two ranks at the same ``seq`` in different ``op``s disagree.
A send or recv is no collective: its ``seq`` counts the messages of its sender-receiver pair (the
n-th send from 0 to 1 meets 1's n-th recv from 0), as mpviz.distributed counts them.
``init_process_group`` is ``dist.rendezvous`` begin/end; an ``async_op=True`` call (or
isend/irecv) ends when its ``Work.wait()`` returns.

Not visible from Python, said once per process as a ``not_recorded`` note (never blank time):
gloo's threads and sockets, and DDP's gradient all-reduces (its C++ Reducer, in ``backward()``).
DDP's construction is seen: its parameter check and broadcast are collectives of the group.

Installed by torch_hooks.install() (torch 2.13 only) as torch is imported, in both modules'
names: ``from torch.distributed import all_reduce`` finds the wrapper.
"""
import functools
import inspect
import threading
import weakref

from . import recorder

# op -> the argument holding the tensor(s) this rank sends in (their bytes are ``nbytes``)
COLLECTIVES = {
    "all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
    "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor", "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input", "reduce_scatter_single": "input",
    "gather": "tensor", "scatter": "scatter_list", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "barrier": None, "monitored_barrier": None,
    "all_gather_object": None, "broadcast_object_list": None, "gather_object": None,
    "scatter_object_list": None, "all_reduce_coalesced": "tensors",
    "send": "tensor", "recv": "tensor", "isend": "tensor", "irecv": "tensor",
}
PEER = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}
# DDP's construction, C++ collectives called from Python through torch.distributed's names
DDP_COLLECTIVES = {"_verify_params_across_processes": 1, "_broadcast_coalesced": 1}

_here = threading.local()          # .depth: collectives entered (only the outermost is recorded)
_seq = {}                          # group's ranks (tuple) -> collectives called on it so far
_pending = weakref.WeakKeyDictionary()    # an async op's Work -> its end event's args
_said = set()                      # not_recorded notes this process has written
DDP_NOTE = "DistributedDataParallel's gradient all-reduces"   # (dist_verdict reads it)


def install(torch):
    """Wrap torch.distributed's rendezvous, collectives and DDP's construction (once)."""
    import torch.distributed as dist
    if not dist.is_available():
        return
    import torch.distributed.distributed_c10d as c10d
    _replace(dist, c10d, "init_process_group", lambda f: _calling(_init_process_group, f))
    _replace(dist, c10d, "destroy_process_group", lambda f: _calling(_destroy_process_group, f))
    for op in COLLECTIVES:
        if hasattr(c10d, op):
            _replace(dist, c10d, op, lambda f, op=op: _collective(op, f))
    for op in DDP_COLLECTIVES:
        if hasattr(dist, op):
            _replace(dist, None, op, lambda f, op=op: _collective(op, f, ddp=True))
    import sys
    spawn = sys.modules["torch.multiprocessing.spawn"]   # (the module; the name is a function's)
    spawn._wrap = _calling(_spawned, spawn._wrap)        # (looked up by name in the child)
    from torch.nn.parallel import distributed as ddp
    init = ddp.DistributedDataParallel.__init__
    ddp.DistributedDataParallel.__init__ = functools.wraps(init)(
        lambda self, *a, **k: _ddp_init(init, self, *a, **k))


def _replace(dist, c10d, name, wrap):
    """Replace torch's function `name` by ``wrap(it)`` in both modules' namespaces."""
    original = getattr(c10d if c10d is not None else dist, name)
    wrapper = wrap(original)
    for module in (dist, c10d):
        if module is not None and getattr(module, name, None) is original:
            setattr(module, name, wrapper)


def _calling(hook, original):
    """``hook(original, *args, **kwargs)`` as a function that looks like `original`."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)
    return wrapper


def _on():
    return recorder.ENABLED


# --- the rendezvous ---------------------------------------------------------------------------

def _init_process_group(original, *args, **kwargs):
    if not _on():
        return original(*args, **kwargs)
    import os
    named = _bind(original, args, kwargs)
    rank = named.get("rank", -1)
    world = named.get("world_size", -1)
    rank = int(os.environ.get("RANK", -1)) if rank == -1 else rank
    world = int(os.environ.get("WORLD_SIZE", -1)) if world == -1 else world
    backend = named.get("backend")
    backend = None if backend is None else str(backend)
    init_method = named.get("init_method") or ("store" if named.get("store") else "env://")
    about = dict(rank=rank, world_size=world, backend=backend, init_method=init_method,
                 library="torch.distributed")
    recorder.flag_rendezvous()
    recorder.emit("dist.rendezvous", phase="begin", **about)
    try:
        result = original(*args, **kwargs)
    except BaseException as exc:
        recorder.emit("dist.rendezvous", phase="end", error=_error(exc), **about)
        raise
    import torch.distributed as dist
    about.update(rank=dist.get_rank(), world_size=dist.get_world_size(),
                 backend=str(dist.get_backend()))
    recorder.emit("dist.rendezvous", phase="end", error=None, **about)
    from .trace import UNKNOWN
    _note("torch.distributed", (
        f"{about['backend']}'s own threads, and the bytes they move over its sockets, run in "
        f"C++: each collective's begin and end in each rank are recorded (dist.collective), "
        f"not what happens inside it (its messages and segments: {UNKNOWN})"),
        "torch.profiler records gloo's work; py-spy dump --native shows where its threads are")
    return result


def _destroy_process_group(original, *args, **kwargs):
    if _on():
        import torch.distributed as dist
        if dist.is_initialized():
            recorder.emit("dist.destroy", rank=dist.get_rank())
    _group_ranks.clear()
    return original(*args, **kwargs)


# --- the collectives -----------------------------------------------------------------------------

def _collective(op, original, ddp=False):
    """The wrapper of collective `op`: begin and end around the outermost call."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        depth = getattr(_here, "depth", 0)
        if depth or not _on():
            return _nested(original, args, kwargs)
        about = _about(op, original, args, kwargs, ddp)
        if about is None:                 # (not initialised, not in the group: torch says so)
            return _nested(original, args, kwargs)
        recorder.emit("dist.collective", phase="begin", **about)
        _here.depth = 1
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            recorder.emit("dist.collective", phase="end", error=_error(exc), **about)
            raise
        finally:
            _here.depth = 0
        work = result if op in ("isend", "irecv") or about.get("async_op") else None
        if work is not None and hasattr(work, "wait"):
            _watch_waits(type(work))
            _pending[work] = about        # it ends when the program waits for it
        else:
            if op == "recv" and about.get("peer") is None and isinstance(result, int):
                about["peer"] = result    # recv from anyone: torch returns who sent it
            recorder.emit("dist.collective", phase="end", error=None, **about)
        return result
    return wrapper


def _nested(original, args, kwargs):
    _here.depth = getattr(_here, "depth", 0) + 1
    try:
        return original(*args, **kwargs)
    finally:
        _here.depth -= 1


def _about(op, original, args, kwargs, ddp):
    """The args of `op`'s events (the seq counted now), or None if torch will refuse the call."""
    import torch.distributed as dist
    if not dist.is_initialized():
        return None
    if ddp:                                # (process_group, tensors, ...): positional, in C++
        group, named = args[0] if args else kwargs.get("process_group"), {}
    else:
        named = _named(original, args, kwargs)
        group = named.get("group")
    group = group or dist.group.WORLD
    ranks = _group_ranks.get(group)
    if ranks is None:
        try:
            ranks = _group_ranks[group] = tuple(dist.get_process_group_ranks(group))
        except Exception:
            return None
    rank = dist.get_rank()
    if rank not in ranks:
        return None
    # a send and its recv match by their pair, not by the group's order: counted per pair
    key = (ranks, op.lstrip("i"), named.get(PEER[op])) if op in PEER else ranks
    _seq[key] = _seq.get(key, 0) + 1
    about = dict(op=op, seq=_seq[key], group=list(ranks), rank=rank,
                 nbytes=_nbytes(named.get(COLLECTIVES.get(op))) if not ddp else
                 _nbytes(args[DDP_COLLECTIVES[op]] if len(args) > 1 else None))
    if op in PEER:
        about["peer"] = named.get(PEER[op])
    if named.get("async_op"):
        about["async_op"] = True
    return about


def _watch_waits(cls):
    """Wrap ``Work.wait`` (once, when the first async collective is recorded: the synchronous
    ones wait inside torch, and their tracebacks stay torch's own)."""
    wait = cls.wait
    if getattr(wait, "_mpviz", False):
        return
    cls.wait = functools.wraps(wait)(lambda self, *a, **k: _waited(wait, self, *a, **k))
    cls.wait._mpviz = True


def _waited(wait, work, *args, **kwargs):
    """Work.wait(): an async collective of ours ends when it returns."""
    about = _pending.pop(work, None) if _on() else None
    try:
        result = wait(work, *args, **kwargs)
    except BaseException as exc:
        if about is not None:
            recorder.emit("dist.collective", phase="end", error=_error(exc), **about)
        raise
    if about is not None:
        recorder.emit("dist.collective", phase="end", error=None, **about)
    return result


def _nbytes(value):
    """Bytes of a tensor, or of the tensors in a list; None for anything else (objects)."""
    if hasattr(value, "element_size") and hasattr(value, "numel"):
        return value.element_size() * value.numel()
    if isinstance(value, (list, tuple)) and value and \
            all(hasattr(v, "element_size") for v in value):
        return sum(v.element_size() * v.numel() for v in value)
    return 0 if value is None else None


_signatures = {}
_params = {}
_group_ranks = {}                   # a process group -> its global ranks (emptied at destroy)


def _named(function, args, kwargs):
    """``{parameter: value}`` of a call, as passed (a missing one: its default, None or False,
    is what .get() gives): the parameter names read once, ~1 us a call."""
    names = _params.get(function)
    if names is None:
        names = _params[function] = list(inspect.signature(function).parameters)
    named = dict(zip(names, args))
    named.update(kwargs)
    return named


def _bind(function, args, kwargs):
    """``{parameter: value}`` of a call, defaults included (the signature read once)."""
    sig = _signatures.get(function)
    if sig is None:
        sig = _signatures[function] = inspect.signature(function)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return {}                          # torch raises it itself, with its own words
    bound.apply_defaults()
    return bound.arguments


def _error(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _spawned(original, fn, i, *args, **kwargs):
    """torch.multiprocessing.spawn's ``_wrap``, in the child: it catches what ``fn`` raises,
    hands the traceback to the parent and exits with code 1 -- the exception itself is
    recorded here (``spawn.raised``), so a verdict can name it."""
    return original(_raising(fn, i), i, *args, **kwargs)


def _raising(fn, i):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if _on():
                more = {"in_backward": True} if _in_backward(exc) else {}
                recorder.emit("spawn.raised", index=i, error=_error(exc), **more)
            raise
    return run


def _in_backward(exc):
    """Did `exc` come out of autograd's backward() (where DDP all-reduces the gradients)?"""
    import os
    import traceback
    return any(frame.f_code.co_name == "backward" and
               f"torch{os.sep}" in frame.f_code.co_filename
               for frame, _ in traceback.walk_tb(exc.__traceback__))


# --- DDP -----------------------------------------------------------------------------------------

def _ddp_init(init, module, *args, **kwargs):
    init(module, *args, **kwargs)
    if _on():
        params = [p for p in module.module.parameters() if p.requires_grad]
        nbytes = sum(p.element_size() * p.numel() for p in params)
        _note(DDP_NOTE, (
            f"its Reducer (C++) all-reduces the gradients in buckets during each "
            f"loss.backward(), from autograd hooks Python does not see: {nbytes:,} bytes of "
            f"gradients ({len(params)} parameters) per rank per backward, not drawn; the time "
            f"they take is inside backward()"),
            "torch.profiler records each bucket's all-reduce (gloo:all_reduce)")


def _note(what, why, fix):
    if what not in _said:
        _said.add(what)
        recorder.emit("not_recorded", what=what, why=why, fix=fix, torch=True)
