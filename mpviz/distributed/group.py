"""A process group: some ranks, their ring, and the collectives they run on it, checked and recorded.

    all_reduce(t)           every rank: ``t`` becomes the sum (or max ...) of everyone's ``t``
    broadcast(t, src)       every rank: ``t`` becomes rank ``src``'s ``t``
    all_gather(ts, t)       every rank: ``ts[j]`` becomes rank j's ``t``
    reduce_scatter(t, ts)   rank j: ``t`` becomes the sum over ranks of their ``ts[j]``
    barrier()               nobody leaves before everybody arrived
    send(t, dst) / recv(t, src)     one rank to one rank (the world's links, not the ring)

Each collective of a group has a number, ``seq``, counted by each rank (1, 2, 3 ...): it is how a
picture lines the ranks up, and how an error names the collective ("all_reduce #3"). On entering,
a rank leaves a note in the store (``at/<group>/<rank>`` = its op and seq, one send, no wait);
if the ring stalls, the waiting rank reads the notes and names the ranks that did not arrive.

The start message each rank sends its next rank carries a *header*, ``all_reduce(float32 [3],
SUM)``: a rank whose previous rank entered something else stops, and says which two ranks
disagree. Failures travel round the ring (links' ``X``), so every rank raises, none hangs.
"""
import time

import numpy as np

from ..trace import recorder
from . import links
from .errors import CollectiveError
from .links import Aborted, LinkClosed, LinkTimeout
from .ring import Buffer, Mismatch, Ring


class ReduceOp:
    """torch.distributed.ReduceOp's names; each is the NumPy ufunc that combines two chunks."""
    SUM, PRODUCT, MIN, MAX, AVG = "SUM", "PRODUCT", "MIN", "MAX", "AVG"
    UFUNC = {"SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply, "MIN": np.minimum,
             "MAX": np.maximum}


def as_array(tensor, what):
    """A NumPy view sharing `tensor`'s memory (mpviz Tensor, torch CPU tensor or ndarray)."""
    if isinstance(tensor, np.ndarray):
        return tensor
    if hasattr(tensor, "_storage") and hasattr(tensor, "_np"):        # an mpviz Tensor
        if tensor.is_cuda:
            raise TypeError(f"{what} is on {tensor.device}: mpviz.distributed works on CPU tensors. "
                            f"Fix: pass {what}.cpu() and copy the result back.")
        return tensor._np
    if type(tensor).__module__.startswith("torch") and hasattr(tensor, "numpy"):
        return tensor.detach().numpy()
    raise TypeError(f"{what} must be a tensor (mpviz, torch CPU) or a NumPy array, not "
                    f"{type(tensor).__name__}. Fix: wrap it, e.g. mpviz.tensor(x).")


def event_error(error):
    """An error as events.py's ``error`` fields hold it, as the torch hooks write it: 'Type:
    message', the message up to its "Why" (None: no error)."""
    return None if error is None else f"{type(error).__name__}: {str(error).split('. Why')[0]}"


def describe(array):
    return f"{array.dtype} {list(array.shape)}"


class ProcessGroup:
    """Ranks `members` (global ranks, sorted) of `world`; this rank is one of them."""

    def __init__(self, world, tag, members, deadline, timeout):
        self.world, self.tag, self.members, self.timeout = world, tag, members, timeout
        self.ring = Ring(world.links, tag, members, world.rank, deadline)
        self.seq = 0

    def rank(self):
        return self.members.index(self.world.rank)

    def size(self):
        return len(self.members)

    def __repr__(self):
        return f"<mpviz.distributed.ProcessGroup ranks={self.members}>"

    # -- one collective, start to end: seq, note, record, run, turn failures into messages ------

    def run(self, op, header, nbytes, body, room=None):
        """Run collective `op` #seq: ``body(start, deadline)`` is the collective's own part.

        It fills this rank's ring buffer (``room`` bytes; default `nbytes`), calls ``start()``
        (the S exchange, where `header` is compared with the previous rank's), then runs its
        steps. With a group of one rank, `start` is None: the body only copies, if anything."""
        ring, rank = self.ring, self.world.rank
        if ring.broken is not None:
            raise CollectiveError(f"{op}: this group failed earlier and cannot be used again: "
                                  f"{ring.broken}", op)
        self.seq += 1
        seq = self.seq
        self.world.note(f"at/{self.tag}/{rank}", (op, seq))
        record = recorder.ENABLED
        if record:
            recorder.emit("dist.collective", phase="begin", op=op, seq=seq, group=self.members,
                          rank=rank, nbytes=nbytes)
        error = None
        try:
            deadline = time.monotonic() + self.timeout
            if self.size() == 1:
                return body(None, deadline)
            ring.begin(nbytes if room is None else room, deadline)
            return body(lambda: ring.exchange_start(header, deadline), deadline)
        except Mismatch as m:
            error = self._disagree(op, seq, header, m)
        except LinkTimeout:
            error = self._timed_out(op, seq)
        except LinkClosed as c:
            error = CollectiveError(
                f"{op} #{seq} of group {self.members}: Connection closed by peer (rank {c.peer}): "
                f"rank {c.peer} closed its connection while rank {rank} waited for it. Why: rank {c.peer} exited or crashed (its own error, "
                f"above or in its log, is the first cause). Fix: fix rank {c.peer}'s error; every "
                f"rank must stay until the last collective.", op, seq, [c.peer])
        except Aborted as a:
            error = CollectiveError(str(a), op, seq)
        finally:
            if record:
                recorder.emit("dist.collective", phase="end", op=op, seq=seq, group=self.members,
                              rank=rank, nbytes=nbytes,
                              error=event_error(error))
        ring.abort(str(error))
        raise error

    def _disagree(self, op, seq, header, m):
        me = self.world.rank
        a, b = sorted((m.peer, me))
        return CollectiveError(
            f"ranks {a} and {b} disagree at collective #{seq} of group {self.members}: rank "
            f"{m.peer} called {m.theirs}, rank {me} called {header}. Why: every rank of a group "
            f"must call the same collectives, in the same order, with tensors of the same size and "
            f"dtype. Fix: make the calls match (look for a collective inside `if rank == ...:`, or "
            f"a tensor whose size depends on the rank).", op, seq, [a, b])

    def _timed_out(self, op, seq):
        """Which ranks never arrived at `op` #`seq`: from the notes they left in the store."""
        keys = [f"at/{self.tag}/{r}" for r in self.members]
        try:
            notes = self.world.store.get_many(keys)
        except (OSError, EOFError):
            notes = None
        ms = int(self.timeout * 1000)
        head = f"Timed out waiting {ms}ms for {op} #{seq} of group {self.members} on rank " \
               f"{self.world.rank}"
        if notes is None:
            return CollectiveError(f"{head}; the store (rank 0) is gone, so who did not arrive is "
                                   f"unknown. Why: rank 0 exited. Fix: keep rank 0 alive until "
                                   f"every rank called destroy_process_group().", op, seq)
        missing, where = [], []
        for r, key in zip(self.members, keys):
            last = notes.get(key)
            if last is None or last[1] < seq:
                missing.append(r)
                where.append(f"rank {r} " + ("entered no collective of this group yet" if last is None
                                             else f"last entered {last[0]} #{last[1]}"))
        if not missing:
            return CollectiveError(f"{head}: every rank arrived, but the ring did not finish. Why: a "
                                   f"rank stalled inside {op}. Fix: look at that rank's stack.",
                                   op, seq)
        return CollectiveError(
            f"{head}: ranks {missing} did not arrive ({'; '.join(where)}). Why: every rank of the "
            f"group must call the same collectives in the same order; a rank that skipped this one "
            f"(a collective inside `if rank == 0:`), is stuck elsewhere, or is slower than the "
            f"timeout leaves the others waiting. Fix: make every rank call {op}; if one rank is "
            f"only slow, pass a longer timeout= to init_process_group.", op, seq, missing)

    # -- the collectives ----------------------------------------------------------------------

    def all_reduce(self, array, op):
        combine = ReduceOp.UFUNC[op]
        header = f"all_reduce({describe(array)}, {op})"

        def body(start, deadline):
            if start is None:
                return
            W, ring, n = self.size(), self.ring, array.size
            flat = array.reshape(-1)
            c = (ring.index - 1) % W               # the chunk the next rank reads at its step 0
            lo, hi = c * n // W, (c + 1) * n // W
            ring.mine.view(array.dtype, n)[lo:hi] = flat[lo:hi]
            start()
            out = ring.steps(0, 2 * W - 2, array.dtype, n, combine, "all_reduce", self.seq,
                             deadline, source=flat)
            array[...] = out.reshape(array.shape)
            ring.end()
        self.run("all_reduce", header, array.nbytes, body)
        if op == ReduceOp.AVG:
            array /= self.size()

    def barrier(self):
        def body(start, deadline):
            if start is not None:
                start()
                self.ring.steps(0, 2 * self.size() - 2, np.uint8, 0, np.add, "barrier", self.seq,
                                deadline)
                self.ring.end()
        self.run("barrier", "barrier()", 0, body)

    def broadcast(self, array, src):
        header = f"broadcast({describe(array)}, src={src})"

        def body(start, deadline):
            if start is None:
                return
            if self.world.rank == src:
                self.ring.mine.view(array.dtype, array.size)[:] = array.reshape(-1)
            start()
            self.ring.broadcast(array, src, deadline)
            self.ring.end()
        self.run("broadcast", header, array.nbytes, body)

    def all_gather(self, arrays, array):
        W, n = self.size(), array.size
        header = f"all_gather({describe(array)})"

        def body(start, deadline):
            if start is None:
                arrays[0][...] = array
                return
            i = self.rank()
            self.ring.mine.view(array.dtype, W * n)[i * n:(i + 1) * n] = array.reshape(-1)
            start()
            out = self.ring.steps(W - 1, 2 * W - 2, array.dtype, W * n, None, "all_gather",
                                  self.seq, deadline)
            for j, a in enumerate(arrays):
                a[...] = out[j * n:(j + 1) * n].reshape(a.shape)
            self.ring.end()
        self.run("all_gather", header, array.nbytes, body, room=W * array.nbytes)

    def reduce_scatter(self, array, arrays, op):
        W, n = self.size(), array.size
        combine = ReduceOp.UFUNC[op]
        header = f"reduce_scatter({describe(array)}, {op})"

        def body(start, deadline):
            if start is None:
                array[...] = arrays[0]
                return
            mine = self.ring.mine.view(array.dtype, W * n)
            for j, a in enumerate(arrays):
                mine[j * n:(j + 1) * n] = a.reshape(-1)
            start()
            out = self.ring.steps(0, W - 1, array.dtype, W * n, combine, "reduce_scatter",
                                  self.seq, deadline)
            i = self.rank()
            array[...] = out[i * n:(i + 1) * n].reshape(array.shape)
            self.ring.end()
        self.run("reduce_scatter", header, sum(a.nbytes for a in arrays), body)
        if op == ReduceOp.AVG:
            array /= W

    # -- one rank to one rank: a memfd per message, its fd sent over the pair's own socket ------

    def send(self, array, dst):
        self._p2p("send", array, dst)

    def recv(self, array, src):
        self._p2p("recv", array, src)

    def _p2p(self, op, array, peer):
        world, rank = self.world, self.world.rank
        count = world.p2p_seq
        key = (op, peer)
        count[key] = seq = count.get(key, 0) + 1          # the n-th message of this pair
        header = describe(array)
        record = recorder.ENABLED
        if record:
            recorder.emit("dist.collective", phase="begin", op=op, seq=seq, group=self.members,
                          rank=rank, nbytes=array.nbytes, peer=peer)
        error = None
        deadline = time.monotonic() + world.timeout
        try:
            if op == "send":
                sock = world.p2p_socket("out", peer, deadline)
                buffer = Buffer(max(array.nbytes, 1))
                buffer.view(array.dtype, array.size)[:] = array.reshape(-1)
                links.send(sock, b"P", header.encode(), [buffer.fd])
                buffer.close_fd()
            else:
                sock = world.p2p_socket("in", peer, deadline)
                _, payload, fds = links.recv(sock, peer, deadline)
                buffer = Buffer(max(array.nbytes, 1), fds[0])
                buffer.close_fd()
                theirs = payload.decode()
                if theirs != header:
                    raise Mismatch(peer, theirs)
                array[...] = buffer.view(array.dtype, array.size).reshape(array.shape)
        except Mismatch as m:
            error = CollectiveError(
                f"recv #{seq} from rank {peer}: rank {peer} sent {m.theirs}, rank {rank} receives "
                f"into {header}. Why: recv copies into the tensor you give it, so its size and "
                f"dtype must be the sent tensor's. Fix: make them match.", op, seq, [peer, rank])
        except LinkTimeout:
            error = self._timed_out_p2p(op, seq, peer)
        except (LinkClosed, OSError):
            way = "from" if op == "recv" else "to"
            error = CollectiveError(
                f"{op} #{seq} {way} rank {peer}: Connection closed by peer (rank {peer}): rank "
                f"{peer} ended while rank {rank} waited for it, so it will never "
                f"{'send' if op == 'recv' else 'receive'} (torch's gloo says the same). Why: rank "
                f"{peer} exited or crashed (its own error, above or in its log, is the first "
                f"cause). Fix: fix rank {peer}'s error first; every rank must stay until its last "
                f"send/recv.", op, seq, [peer])
        finally:
            if record:
                recorder.emit("dist.collective", phase="end", op=op, seq=seq, group=self.members,
                              rank=rank, nbytes=array.nbytes, peer=peer,
                              error=event_error(error))
        if error is not None:
            raise error

    def _timed_out_p2p(self, op, seq, peer):
        other = "send" if op == "recv" else "recv"
        ms = int(self.timeout * 1000)
        return CollectiveError(
            f"Timed out waiting {ms}ms for {op} #{seq} on rank {self.world.rank}: rank {peer} did "
            f"not {other}. Why: every recv needs a matching send from the rank it names (and the "
            f"other way round). Fix: call dist.{other}(tensor, {self.world.rank}) on rank {peer}.",
            op, seq, [peer])
