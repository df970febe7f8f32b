"""The ring: how W ranks on one machine sum a tensor through shared memory, 2(W-1) steps.

Each rank copies its tensor into a buffer of its own (a memfd, mapped; its neighbour maps it
too), cut into W chunks. At step t, rank i reads chunk c = (i - 2 - t) mod W of its *previous*
rank's buffer, adds it into its own (the first W-1 steps: **reduce-scatter**) or copies it
(the last W-1 steps: **all-gather**), then tells its *next* rank "step t done"::

    3 ranks, chunks a b c; after the reduce-scatter rank i holds the full sum of chunk i.
                 rank 0        rank 1        rank 2         (+= reads the previous rank's chunk)
    step 0       b += b2       c += c0       a += a1
    step 1       a += a2+a1    b += b0+b2    c += c1+c0     reduce-scatter done: rank i owns chunk i
    step 2       c  = sum      a  = sum      b  = sum
    step 3       b  = sum      c  = sum      a  = sum       all-gather done: every rank has a b c

Every rank moves 2(W-1)/W of the tensor whatever W is (why rings scale): here, by reading its
neighbour's memory; the sockets (links.py) carry only "done" messages and new buffers' fds.

**Why it is safe without locks.** Step t of rank i needs step t-1 of rank i-1, which needed step
t-2 of i-2 ...: so when rank i writes chunk c at step t, its next rank, W-1 hops back round the
ring, has finished step t+1-W, the last step that read chunk c from rank i. Between two
collectives that chain is cut, so a rank sends an ``A`` (ack) to its previous rank when it has
finished reading it, and a rank waits for its next rank's ack before writing its buffer again.

Adapted from Baidu's ring all-reduce (2017) and gloo's ``AllreduceRing``; left out: pipelining
chunks in smaller pieces, more than one host (gloo and NCCL do both: torch.distributed).
"""
import mmap
import os
import struct

import numpy as np

from ..trace import recorder
from . import links
from .links import send

_START = struct.Struct("<q")      # S's payload: the buffer's capacity, then the header text
_STEP = struct.Struct("<q")       # D's payload: the step number
MIN_BUFFER = 64 << 10


class Buffer:
    """One memfd, mapped: a rank's own ring buffer, or its view of the previous rank's."""

    def __init__(self, capacity, fd=None):
        self.capacity = capacity
        if fd is None:
            fd = os.memfd_create("mpviz_dist_ring", os.MFD_CLOEXEC)
            os.ftruncate(fd, capacity)
        self.fd = fd
        self.map = mmap.mmap(fd, capacity)

    def view(self, dtype, count):
        return np.frombuffer(self.map, dtype, count)

    def close_fd(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Mismatch(Exception):
    """Raised (inside mpviz.distributed) when the previous rank entered another collective."""

    def __init__(self, peer, theirs):
        super().__init__(peer, theirs)
        self.peer, self.theirs = peer, theirs


class Ring:
    """One group's ring, seen from one rank: its neighbours, its buffer, its view of prev's."""

    def __init__(self, link, tag, members, rank, deadline):
        self.members, self.rank = members, rank
        self.size, self.index = len(members), members.index(rank)
        self.prev = members[(self.index - 1) % self.size]
        self.next = members[(self.index + 1) % self.size]
        self.mine = self.theirs = None
        self.owed = False                # the next rank owes an ack for the last collective
        self.broken = None               # the reason, once a collective failed
        self.to_next = self.from_prev = None
        if self.size > 1:
            self.to_next = link.connect(tag, self.next, deadline)   # connect first, then accept:
            self.from_prev = link.accept(tag, self.prev, deadline)  # nobody waits in a circle

    # -- the start of every collective: S to the next rank, S from the previous one -----------

    def begin(self, nbytes, deadline):
        """Wait until the next rank stopped reading us; make sure our buffer holds `nbytes`."""
        if self.owed:
            links.recv(self.to_next, self.next, deadline)         # its A
            self.owed = False
        if self.mine is None or self.mine.capacity < nbytes:
            capacity = MIN_BUFFER
            while capacity < nbytes:
                capacity *= 2
            self.mine = Buffer(capacity)

    def exchange_start(self, header, deadline):
        """Tell the next rank what we entered; learn (and check) what the previous one did."""
        fds = [self.mine.fd] if self.mine.fd is not None else []
        self.send_next(b"S", _START.pack(self.mine.capacity) + header.encode(), fds)
        self.mine.close_fd()                       # the next rank has its own copy of the fd now
        _, payload, fds = links.recv(self.from_prev, self.prev, deadline)
        (capacity,) = _START.unpack_from(payload)
        if fds:
            self.theirs = Buffer(capacity, fds[0])
            self.theirs.close_fd()
        theirs = payload[_START.size:].decode()
        if theirs != header:
            raise Mismatch(self.prev, theirs)

    def send_next(self, tag, payload=b"", fds=()):
        """Send to the next rank; if it has gone, say why: the abort it sent us first, if any."""
        try:
            send(self.to_next, tag, payload, fds)
        except OSError:
            try:
                links.recv(self.to_next, self.next, 0.0)     # a deadline long past: its X, if there
            except links.LinkTimeout:
                pass
            raise links.LinkClosed(self.next) from None

    def end(self):
        """We finished reading the previous rank's buffer: say so (it waits before writing)."""
        try:
            send(self.from_prev, b"A")
        except OSError:
            pass                                   # it left after its last step: nothing to free
        self.owed = True

    def abort(self, reason):
        """Pass `reason` on to both neighbours, once; the group is unusable from now on."""
        if self.broken is None:
            self.broken = reason
            for sock in (self.to_next, self.from_prev):
                try:
                    send(sock, b"X", reason.encode()[:60000])
                except OSError:
                    pass                           # that neighbour is gone already

    # -- the steps ----------------------------------------------------------------------------

    def steps(self, first, last, dtype, count, combine, op, seq, deadline, source=None):
        """Steps first .. last-1 (reduce-scatter: 0 .. W-2; all-gather: W-1 .. 2W-3).

        `source`: where this rank's own values of a reduce-scatter step come from (default: its
        buffer). all_reduce passes the caller's tensor, so that ``mine = source + theirs`` is
        one pass, and only the chunk the next rank reads first had to be copied in."""
        W, i = self.size, self.index
        mine, theirs = self.mine.view(dtype, count), self.theirs.view(dtype, count)
        ours = mine if source is None else source
        item = np.dtype(dtype).itemsize
        for t in range(first, last):
            if t > first:                          # the first step's go was the S message
                links.recv(self.from_prev, self.prev, deadline)
            c = (i - 2 - t) % W
            lo, hi = c * count // W, (c + 1) * count // W
            if t < W - 1:
                combine(ours[lo:hi], theirs[lo:hi], out=mine[lo:hi])
            else:
                mine[lo:hi] = theirs[lo:hi]
            if recorder.ENABLED:
                recorder.emit("dist.ring_step", op=op, seq=seq, step=t, chunk=c,
                              send_to=self.next, recv_from=self.prev, nbytes=(hi - lo) * item)
            if t < last - 1:
                self.send_next(b"D", _STEP.pack(t))
        return mine

    def broadcast(self, array, src, deadline):
        """Pass `array` from `src` round the ring: each rank copies the previous rank's buffer."""
        k = (self.index - self.members.index(src)) % self.size     # hops from src
        count, dtype = array.size, array.dtype
        if k >= 2:
            links.recv(self.from_prev, self.prev, deadline)        # D: the previous rank has it
        if k >= 1:
            theirs = self.theirs.view(dtype, count)
            if k < self.size - 1:
                self.mine.view(dtype, count)[:] = theirs
                self.send_next(b"D", _STEP.pack(0))
            array[...] = theirs.reshape(array.shape)
