"""torch.distributed's functions, by torch's names: the rendezvous, the groups, the collectives.

    init_process_group("mpviz", init_method="env://", rank=r, world_size=W)
        1. the store:   rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect (store.py)
        2. the job:     rank 0 draws a token; every rank opens "\\0mpviz-dist-<token>-<rank>" (links.py)
        3. the join:    every rank adds itself to the store's "joined" and waits until it reads W
        4. the ring:    each rank connects to the next rank, accepts the previous one (ring.py)
    all_reduce(t) / broadcast / all_gather / reduce_scatter / barrier / send / recv
        -> the default group's (or `group=`'s) ProcessGroup (group.py)
    destroy_process_group()   closes the sockets and the store; the memfds go with the last map

Like torch, this module keeps *one* default group per process (``_world``): that is torch's API,
so a program written for torch.distributed runs here by changing its import. ``backend="gloo"`` is
accepted and means the CPU backend, which here is mpviz's ring over shared memory (torch's gloo
sends over TCP); ``"nccl"`` is refused: it is for CUDA GPUs.

mpviz.distributed runs on **one machine** (the ring reads its neighbour's memory). For several
machines use torch.distributed with torchrun; ``mpviz trace`` records it.
"""
import datetime
import ipaddress
import os
import socket
import time
from urllib.parse import urlparse

from .. import _proc
from ..trace import recorder
from . import links
from .errors import DistStoreError
from .group import ProcessGroup, ReduceOp, as_array, event_error
from .store import TCPStore

_world = None                 # this process's default group's world, between init and destroy
LIBRARY = "mpviz.distributed"        # (in dist.rendezvous: verdicts name the library they judge)
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)   # torch's default for gloo
_NOT_INIT_WHAT = ("Default process group has not been initialized, please make sure to call "
                  "init_process_group.")                                   # torch's words
_NOT_INIT_FIX = ("Fix: call dist.init_process_group(backend, rank=rank, world_size=world_size) "
                 "in every process first (and again after destroy_process_group()).")
_NOT_INIT = f"{_NOT_INIT_WHAT} {_NOT_INIT_FIX}"


class GroupMember:
    """torch's marker for "this rank is not in that group": what new_group returns to non-members."""
    NON_GROUP_MEMBER = object()
    WORLD = None


class _World:
    """What init_process_group made: the store, the links, the default group, the p2p sockets."""

    def __init__(self, rank, world_size, timeout, store, link, watch):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.store, self.links, self.watch = store, link, watch
        self.groups = []                       # every ProcessGroup this rank is in
        self.n_groups = 0                      # new_group calls so far (the same on every rank)
        self.p2p = {}                          # ("out"|"in", peer) -> socket
        self.p2p_seq = {}

    def note(self, key, value):
        try:
            self.store.note(key, value)
        except OSError:
            pass                               # rank 0 has gone: its absence is reported later

    def p2p_socket(self, direction, peer, deadline):
        key = (direction, peer)
        if key not in self.p2p:
            self.p2p[key] = (self.links.connect("p2p", peer, deadline, self.watch)
                             if direction == "out" else
                             self.links.accept("p2p", peer, deadline, self.watch))
        return self.p2p[key]

    def close(self):
        for group in self.groups:
            for sock in (group.ring.to_next, group.ring.from_prev):
                if sock is not None:
                    sock.close()
        for sock in self.p2p.values():
            sock.close()
        self.links.close()
        self.watch.close()
        self.store.close()


# -- checking what init_process_group was given ---------------------------------------------------

def _int_from(value, env, name):
    if value is None or value == -1:
        if env not in os.environ:
            raise ValueError(
                f"{name} was not given and the environment variable {env} is not set. Why: each "
                f"process must know its {name}. Fix: init_process_group(..., rank=rank, "
                f"world_size=world_size), or set {env}.")
        value = os.environ[env]
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}. "
                        f"Fix: {name}=2.") from None


def _check_rank(rank, world_size):
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}. Why: it is how many "
                         f"processes take part. Fix: world_size=2 for two processes.")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"rank {rank} is out of range for world_size {world_size}: ranks are 0 .. "
            f"{world_size - 1}. Why: each of the world_size processes takes one rank, 0 first "
            f"(rank 0 runs the store). Fix: pass rank=i with 0 <= i < world_size (spawn's "
            f"first argument), and the same world_size to every process.")


def _where(init_method):
    """(host, port, address_file) from an init method: env://, tcp://host:port or file:///path."""
    url = urlparse(init_method)
    if url.scheme == "env":
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise ValueError(
                    f"Error initializing torch.distributed using env:// rendezvous: environment "
                    f"variable {var} expected, but not set. Fix: os.environ['MASTER_ADDR'] = "
                    f"'127.0.0.1'; os.environ['MASTER_PORT'] = '29500' before init_process_group.")
        return os.environ["MASTER_ADDR"], _port(os.environ["MASTER_PORT"]), None
    if url.scheme == "tcp":
        return url.hostname, _port(url.port), None
    if url.scheme == "file":
        return "127.0.0.1", 0, url.path
    raise ValueError(f"init_method={init_method!r}: the scheme must be env://, tcp://host:port or "
                     f"file:///path. Fix: init_method='env://' (MASTER_ADDR and MASTER_PORT).")


def _port(value):
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"the port {value!r} is not a number. Fix: MASTER_PORT='29500'.") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a TCP port (1 .. 65535). Fix: MASTER_PORT='29500'.")
    return port


def _check_local(host):
    try:
        local = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        local = False
    if not local:
        raise ValueError(
            f"MASTER_ADDR {host!r} is not this machine's loopback address. Why: mpviz.distributed "
            f"runs every rank on one machine (ranks read each other's shared memory), and its "
            f"store listens on 127.0.0.1 only. Fix: MASTER_ADDR='127.0.0.1'; across machines, use "
            f"torch.distributed (backend 'gloo' or 'nccl') with torchrun.")


# -- the rendezvous -------------------------------------------------------------------------------

def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """Join the default process group: block until all `world_size` ranks have joined."""
    global _world
    if _world is not None:
        raise ValueError("trying to initialize the default process group twice! Fix: call "
                         "destroy_process_group() first, or init once per process.")
    if isinstance(backend, str):
        backend = backend.lower()                # (torch's Backend("GLOO") is "gloo" too)
    if backend not in (None, "mpviz", "gloo", "cpu:gloo"):
        raise ValueError(
            f"backend={backend!r} is not a backend of mpviz.distributed. Why: 'nccl' is torch's "
            f"backend for CUDA GPUs; mpviz runs on CPU. Fix: backend='mpviz' (or 'gloo', which "
            f"here means the same CPU backend).")
    if store is not None:
        raise ValueError("store= is not supported by mpviz.distributed: it makes its own TCPStore. "
                         "Fix: pass init_method= (or MASTER_ADDR/MASTER_PORT) instead.")
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__}. "
                        f"Fix: timeout=datetime.timedelta(seconds=30).")
    init_method = init_method or "env://"
    rank = _int_from(rank, "RANK", "rank")
    world_size = _int_from(world_size, "WORLD_SIZE", "world_size")
    _check_rank(rank, world_size)
    host, port, address_file = _where(init_method)
    _check_local(host)
    seconds = timeout.total_seconds()
    backend = backend or "mpviz"
    if recorder.ENABLED:
        recorder.flag_rendezvous()
        recorder.emit("dist.rendezvous", phase="begin", rank=rank, world_size=world_size,
                      backend=backend, init_method=init_method, library=LIBRARY)
    error, made = None, []
    try:
        deadline = time.monotonic() + seconds
        named = ("MASTER_PORT" if init_method == "env://" else      # (the fix names the one
                 f"port in init_method={init_method!r}")            # the program set)
        the_store = TCPStore("127.0.0.1", port, rank == 0, seconds, address_file=address_file,
                             port_from=named)
        made.append(the_store)
        if rank == 0:
            the_store.set("job", links.new_job_token())
            the_store.set("world_size", world_size)
        job = the_store.get("job", max(deadline - time.monotonic(), 0))
        link = links.Links(job, rank)
        made.append(link)
        _join(the_store, rank, world_size, deadline, seconds)
        the_store.forget_secret()             # rank 0: every rank is connected now
        processes = the_store.get_many(f"pid/{r}" for r in range(world_size))
        watch = links.Watch({r: processes.get(f"pid/{r}") for r in range(world_size) if r != rank})
        world = _World(rank, world_size, seconds, the_store, link, watch)
        world.backend = backend
        world.groups.append(ProcessGroup(world, "g0", list(range(world_size)), deadline, seconds))
    except BaseException as e:
        error = e
        for thing in reversed(made):
            thing.close()
        raise
    finally:
        if recorder.ENABLED:
            recorder.emit("dist.rendezvous", phase="end", rank=rank, world_size=world_size,
                          backend=backend, init_method=init_method, library=LIBRARY,
                          error=event_error(error))
    _world = world


def _join(store, rank, world_size, deadline, seconds):
    """Add this rank to the store's count; wait for all; name the ranks that never came."""
    if store.add(f"rank/{rank}", 1) > 1:
        raise ValueError(f"rank {rank} joined twice: two processes passed rank={rank}. Fix: give "
                         f"each process its own rank (spawn's first argument).")
    store.set(f"pid/{rank}", (os.getpid(), _proc.start_time(os.getpid())))   # (links.Watch)
    theirs = store.get("world_size")
    if theirs != world_size:
        raise ValueError(f"rank {rank} passed world_size={world_size}, rank 0 passed {theirs}. "
                         f"Why: every rank must agree on how many there are. Fix: pass the same "
                         f"world_size to every process.")
    store.add("joined", 1)
    joined = store.wait_count("joined", world_size, max(deadline - time.monotonic(), 0))
    if joined < world_size:
        here = store.get_many(f"rank/{r}" for r in range(world_size))
        missing = [r for r in range(world_size) if f"rank/{r}" not in here]
        raise DistStoreError(
            f"Timed out after {seconds:g} seconds waiting for clients. {joined}/{world_size} "
            f"clients joined. Ranks {missing} did not join. Why: init_process_group waits for "
            f"world_size processes; fewer were started (a wrong world_size or nprocs), or they "
            f"use another MASTER_PORT, or crashed before init. Fix: start world_size processes "
            f"(spawn(fn, nprocs=world_size)) with the same MASTER_ADDR/MASTER_PORT.")


def destroy_process_group(group=None):
    """Leave: close this rank's sockets, and on rank 0 the store (its port, its key file)."""
    global _world
    if _world is None:
        raise ValueError(_NOT_INIT)
    if group is None:
        if recorder.ENABLED:                   # before the sockets close: the others see that next
            recorder.emit("dist.destroy", rank=_world.rank)
        _world.close()
        _world = None


def is_initialized():
    return _world is not None


def is_available():
    return True


def _the_world():
    if _world is None:
        raise ValueError(_NOT_INIT)
    return _world


def _group(group, op):
    world = _the_world()
    if group is None:
        return world.groups[0]
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"Running {op} on global rank {world.rank} which does not belong to the given group. "
            f"Why: new_group(ranks) returns this marker to ranks outside `ranks`; torch warns and "
            f"skips the call, mpviz stops here. Fix: call it only on members: "
            f"`if dist.get_rank() in ranks:`.")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must come from new_group(), not {type(group).__name__}. Fix: "
                        f"group=dist.new_group(ranks) (called on every rank), or leave it out "
                        f"for the default group.")
    return group


def get_rank(group=None):
    """This process's rank in `group` (the default group: its global rank); -1 if not a member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        _the_world()
        return -1
    return _group(group, "get_rank").rank()


def get_world_size(group=None):
    if group is GroupMember.NON_GROUP_MEMBER:
        _the_world()
        return -1
    return _group(group, "get_world_size").size()


def get_backend(group=None):
    """The backend init_process_group was given, as torch says it: "gloo" for "gloo" (which
    here runs mpviz's ring: a torch program that checks its backend runs unchanged), "mpviz"
    for "mpviz" or none."""
    return _the_world().backend


def new_group(ranks=None, timeout=None, backend=None, pg_options=None):
    """A group of some ranks. Every rank must call it (the same calls in the same order)."""
    world = _the_world()
    world.n_groups += 1
    members = sorted(set(range(world.world_size) if ranks is None else ranks))
    bad = [r for r in members if not (isinstance(r, int) and 0 <= r < world.world_size)]
    if bad or not members:
        raise ValueError(f"new_group(ranks={ranks!r}): ranks {bad} are not ranks of the world "
                         f"(0 .. {world.world_size - 1}). Why: a group is some of the processes "
                         f"that init_process_group joined. Fix: list ranks of the world, e.g. [0, 1].")
    if world.rank not in members:
        return GroupMember.NON_GROUP_MEMBER
    seconds = world.timeout if timeout is None else timeout.total_seconds()
    group = ProcessGroup(world, f"g{world.n_groups}", members, time.monotonic() + seconds, seconds)
    world.groups.append(group)
    return group


# -- the collectives: check the arguments, then hand them to the group ----------------------------

class Work:
    """What a collective returns with ``async_op=True`` (torch's ``Work``). Here every collective
    has finished when the call returns, so ``wait()`` has nothing left to wait for."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _done(async_op):
    return Work() if async_op else None


def _check_op(op, array, name):
    if op not in ReduceOp.UFUNC:
        raise ValueError(f"{name}: op={op!r} is not a ReduceOp. Fix: op=dist.ReduceOp.SUM.")
    if op == ReduceOp.AVG and array.dtype.kind not in "fc":
        raise TypeError(f"{name}: ReduceOp.AVG needs a floating-point tensor, not {array.dtype}. "
                        f"Fix: t.float(), or SUM and divide yourself.")


def _src_in(group, rank, name, what="src"):
    if rank not in group.members:
        raise ValueError(f"{name}: invalid {what} rank {rank}: the group's ranks are "
                         f"{group.members}. Fix: {what}= one of them (a global rank).")


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    g = _group(group, "all_reduce")
    array = as_array(tensor, "tensor")
    _check_op(op, array, "all_reduce")
    g.all_reduce(array, op)
    return _done(async_op)


def broadcast(tensor, src, group=None, async_op=False):
    g = _group(group, "broadcast")
    _src_in(g, src, "broadcast")
    g.broadcast(as_array(tensor, "tensor"), src)
    return _done(async_op)


def barrier(group=None, async_op=False, device_ids=None):
    _group(group, "barrier").barrier()
    return _done(async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    g = _group(group, "all_gather")
    array = as_array(tensor, "tensor")
    arrays = _list_like(tensor_list, array, g, "all_gather", "tensor_list")
    g.all_gather(arrays, array)
    return _done(async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    g = _group(group, "reduce_scatter")
    array = as_array(output, "output")
    _check_op(op, array, "reduce_scatter")
    arrays = _list_like(input_list, array, g, "reduce_scatter", "input_list")
    g.reduce_scatter(array, arrays, op)
    return _done(async_op)


def _list_like(tensors, array, group, name, what):
    """`tensors` as arrays: one per rank of `group`, each the shape and dtype of `array`."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != group.size():
        n = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(f"{name}: invalid {what} (expected length {group.size()}, got {n}). Why: "
                         f"it holds one tensor per rank of the group. Fix: "
                         f"[torch.zeros_like(t) for _ in range(dist.get_world_size())].")
    arrays = [as_array(t, f"{what}[{j}]") for j, t in enumerate(tensors)]
    for j, a in enumerate(arrays):
        if a.shape != array.shape or a.dtype != array.dtype:
            raise ValueError(f"{name}: invalid tensor size at index {j} (expected {array.dtype} "
                             f"{list(array.shape)}, got {a.dtype} {list(a.shape)}). Fix: make "
                             f"every tensor of {what} like the other argument.")
    return arrays


def send(tensor, dst, group=None, tag=0):
    g = _group(group, "send")
    if dst == g.world.rank:
        raise ValueError("Invalid destination rank: destination rank should not be the same as "
                         "the rank of the current process. Fix: dst= another rank (this process "
                         "is dist.get_rank()); to keep a tensor, no send is needed.")
    _src_in(g, dst, "send", "dst")
    g.send(as_array(tensor, "tensor"), dst)


def recv(tensor, src=None, group=None, tag=0):
    g = _group(group, "recv")
    if src is None:
        raise ValueError("recv(src=None) (from any rank) is not supported by mpviz.distributed. "
                         "Fix: name the sender: recv(tensor, src=0).")
    if src == g.world.rank:
        raise ValueError("Invalid source rank: source rank should not be the same as the rank of "
                         "the current process. Fix: src= the rank that sends (this process is "
                         "dist.get_rank()).")
    _src_in(g, src, "recv")
    g.recv(as_array(tensor, "tensor"), src)
    return src
