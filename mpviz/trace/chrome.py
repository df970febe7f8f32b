"""Export a trace as Chrome Trace Event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

The format is a list of events with a phase ``ph``; timestamps ``ts`` are microseconds (here:
since the first event, the origin is in ``otherData.t0_ns``). What mpviz concepts become::

    process / thread names     M  process_name, thread_name
    process lifetime           b/e  async slice, cat "process", drawn in the parent's track
    queue put/get, pipe        X  short slices; the put carries  bind_id + flow_out, the get
      send/recv                   bind_id + flow_in  (flow v2): Perfetto draws the arrow
    pool task start→done       X  slice in the worker thread
    torch's request for an fd  X  zero-length, asker → the sender's _serve, bound by a flow
    shm segment lifetime       b/e  async, cat "shm", id2.global = segment name, from its
                                  create to when it is freed (_Segments); attach, detach
                                  and a handle are  n  instants on the same id
    lock wait / hold           b/e  async, cat "lock" (holds of different locks need not nest)
    queue depth, shm bytes     C  counters in the first process's track
    everything else            i  thread-scoped instants, args as recorded

Slices are named for people ("put Queue 1", "hold Lock 2", "get the Pool's result queue":
names.py), never by the recorder's ids; the ids stay in each slice's args.

``X``/``B``/``E`` must nest strictly per thread, so a short message slice is clipped at the next
event of its thread (1 µs at most). Async slices have their own tracks and may overlap freely.
Reference: the Trace Event Format document and Perfetto's JSON importer.
"""
import json
from itertools import compress
from operator import attrgetter, itemgetter

from . import names
from .events import Request, has_name

SHORT_US = 1.0
_MESSAGE_OUT = ("queue.put", "pipe.send")
_MESSAGE_IN = ("queue.get", "pipe.recv")


def to_chrome(trace, path=None):
    """Convert `trace` to a Chrome trace dict; write it as JSON to `path` if given."""
    ready = Ready(trace)
    data = ready.as_dict(state_part(trace, ready) + flow_part(trace, ready))
    if path is not None:
        # json.dumps, not json.dump: dump encodes piece by piece in Python (~10x slower: 15 s
        # for a 240,000-event DataLoader trace); dumps uses the C encoder in one go.
        with open(path, "w") as f:
            f.write(json.dumps(data))
    return data


class Ready:
    """What both parts of the export read, worked out once. The export is two lists that do
    not depend on each other: ``state_part`` (names, process lifetimes, segments, locks, pool
    tasks: each event's slice depends on those before it) and ``flow_part`` (the plain
    instants, the message slices and the queues' depth: most of the events). The launcher
    makes them in two processes at once (launcher._trace_json_into); ``to_chrome`` one after
    the other, in this order -- the same list either way."""

    def __init__(self, trace):
        events = self.events = trace.events
        self.t0 = events[0].ts_ns if events else 0
        self.end_us = (events[-1].ts_ns - self.t0) / 1000.0 if events else 0.0
        self.procs = trace.processes()
        self.root = self.procs[0].pid if self.procs else 0
        self.flows = trace.flows()
        self.channels, self.locks = names.for_trace(trace, self.flows)

    def as_dict(self, events):
        """The Chrome trace dict around `events` (what to_chrome returns)."""
        return dict(traceEvents=events, displayTimeUnit="ms",
                    otherData=dict(t0_ns=self.t0, clock="CLOCK_MONOTONIC",
                                   generator="mpviz.trace"))


def state_part(trace, ready):
    """The events whose slices depend on what came before them, in the order to_chrome puts
    them: names, process lifetimes, segments, pool tasks, locks, the puts that failed, the
    rest of the pool's and the lock's events, what is still open at the end."""
    events, t0, procs, root = ready.events, ready.t0, ready.procs, ready.root

    def us(ns):
        return (ns - t0) / 1000.0

    out = []
    _names(trace, procs, out)
    recorded = {e.pid for e in events}
    for p in procs:                                          # process lifetimes
        track = p.ppid if p.ppid in recorded else p.pid
        common = dict(cat="process", id=f"proc-{p.pid}", pid=track, tid=track,
                      name=f"{p.name or 'process'} ({p.pid})")
        out.append(dict(common, ph="b", ts=us(p.start_ns), args=dict(how=p.how)))
        out.append(dict(common, ph="e", ts=us(p.exit_ns) if p.exit_ns else ready.end_us,
                        args=dict(exitcode=p.exitcode, signal=p.signal)))
    starts = {}                                               # pool task (pid, tid, job, index)
    lock_open = {}
    segments = _Segments(out, root, procs, t0, events)
    route = {}                          # kind -> how it is drawn (_route), asked once a kind
    for e in events:
        kind = e.kind
        way = route.get(kind)
        if way is None:
            way = route[kind] = _route(kind)
        if way is _INSTANT or way is _MESSAGE:            # (flow_part's)
            continue
        ts, a = (e.ts_ns - t0) / 1000.0, e.args
        if way is _SEGMENT:
            segments.event(e, ts, a)
            continue
        base = dict(pid=e.pid, tid=e.tid, ts=ts)
        if kind == "queue.put_failed":                     # it never entered the queue
            out.append(dict(base, ph="i", s="t", cat="queue", name=kind, args=dict(a)))
        elif kind == "pool.task" and a.get("phase") in ("start", "done"):
            key = (e.pid, e.tid, a.get("job"), a.get("index"))
            if a["phase"] == "start":
                starts[key] = e
            elif key in starts:
                s = starts.pop(key)
                out.append(dict(pid=e.pid, tid=e.tid, ts=us(s.ts_ns), ph="X", cat="pool",
                                dur=us(e.ts_ns) - us(s.ts_ns), name=f"task {a.get('func')}",
                                args=dict(a)))
        elif kind.startswith("lock."):
            _lock(e, base, a, out, lock_open, ready.locks.name(a.get("lock")))
        else:
            out.append(dict(base, ph="i", s="t", cat=kind.split(".")[0], name=kind,
                            args=dict(a)))
    segments.ended_by(events[-1].ts_ns if events else t0)
    for (pid, tid, _job, _index), s in starts.items():        # tasks that never finished
        out.append(dict(pid=pid, tid=tid, ts=us(s.ts_ns), ph="i", s="t", cat="pool",
                        name="pool.task (unfinished)", args=dict(s.args)))
    _close_async(out, ready.end_us)
    return out


def flow_part(trace, ready):
    """The plain instants (most events: one dict each), the message slices with their flow
    arrows, each queue's depth (a counter; a put that failed takes its item back out), and
    torch's requests for an fd. Names a queue that carried no message as it comes
    (``ready.channels`` grows). No async slice: state_part closes those."""
    events, t0, root, channels = ready.events, ready.t0, ready.root, ready.channels
    flows = ready.flows

    def channel_name(ch):
        if ch not in channels:                 # (a queue that carried no message)
            channels[ch] = names.next_queue_name(channels)
        return channels[ch]

    out, depth = [], {}
    gets = {f.get.args["msg"] for f in flows if f.get is not None}
    puts = {f.put.args["msg"] for f in flows}
    next_ts = _next_event_ts(events)
    route = {}                          # kind -> how it is drawn (_route), asked once a kind
    for i, e in enumerate(events):
        kind = e.kind
        way = route.get(kind)
        if way is None:
            way = route[kind] = _route(kind)
        if way is _INSTANT:                  # (most events: one dict, made at once)
            out.append({"pid": e.pid, "tid": e.tid, "ts": (e.ts_ns - t0) / 1000.0, "ph": "i",
                        "s": "t", "cat": kind.partition(".")[0], "name": kind,
                        "args": dict(e.args)})
        elif way is _MESSAGE:
            ts, a = (e.ts_ns - t0) / 1000.0, e.args
            channel = channel_name(a.get("queue") or a.get("pipe"))
            after = next_ts[i]
            dur = min(SHORT_US, (after - t0) / 1000.0 - ts) if after is not None else SHORT_US
            cat, _, verb = kind.partition(".")
            x = {"pid": e.pid, "tid": e.tid, "ts": ts, "ph": "X", "dur": dur, "cat": cat,
                 "name": f"{verb} {channel}", "args": dict(a)}
            if kind in _MESSAGE_OUT:
                if a["msg"] in gets:
                    x["bind_id"], x["flow_out"] = a["msg"], True
            elif a["msg"] in puts:
                x["bind_id"], x["flow_in"] = a["msg"], True
            out.append(x)
            if cat == "queue":
                _depth(out, depth, channel, 1 if kind == "queue.put" else -1, root, ts)
        elif kind == "queue.put_failed":
            a = e.args
            if a.get("msg") is not None and a.get("queue") is not None:  # (None: mpviz's
                # Queue, which records no put then; a feeder's pickler, which knows no queue)
                _depth(out, depth, channel_name(a["queue"]), -1, root, (e.ts_ns - t0) / 1000.0)
    _fd_requests(trace, lambda ns: (ns - t0) / 1000.0, out)
    return out


def _fd_requests(trace, us, out):
    """torch's requests for an fd (events.Request: read off the hand-over, not messages): a
    zero-length slice where the asker's thread sent it and one where the sender's ``_serve``
    thread answered, bound by a flow -- the arrow the timeline draws. (Zero-length: they sit
    between the thread's recorded events and can overlap no slice.)"""
    # torch's hand-overs, paired by token as analysis._fd_key pairs them (torch's token names
    # its sender's socket); not through the analysis index, which trace.json is written without
    fds = [e for e in trace.of_kind("fd.send", "fd.recv") if e.args.get("torch")]
    sent = {e.args.get("token"): e for e in fds if e.kind == "fd.send" and e.args.get("token")}
    for got in (e for e in fds if e.kind == "fd.recv"):
        answer = sent.get(got.args.get("token"))
        request = Request.of(answer, got) if answer is not None else None
        if request is None:
            continue
        flow = f"fd-request {got.args['token']}"
        args = {"token": got.args["token"], "nbytes": request.nbytes}
        out.append({"pid": got.pid, "tid": got.tid, "ts": us(request.put.ts_ns), "ph": "X",
                    "dur": 0, "cat": "fd", "name": f"ask for an fd ({request.nbytes} B)",
                    "args": args, "bind_id": flow, "flow_out": True})
        out.append({"pid": answer.pid, "tid": answer.tid, "ts": us(answer.ts_ns), "ph": "X",
                    "dur": 0, "cat": "fd", "name": "hand the fd over", "args": args,
                    "bind_id": flow, "flow_in": True})


def _names(trace, procs, out):
    for p in procs:
        out.append(dict(ph="M", pid=p.pid, tid=p.pid, name="process_name",
                        args=dict(name=f"{p.name or 'process'} (pid {p.pid})")))
    names = {(e.pid, e.tid): e.args.get("name") for e in trace.events if e.kind == "thread.start"}
    for key in sorted({(e.pid, e.tid) for e in trace.events}):
        name = "MainThread" if key[0] == key[1] else names.get(key) or f"thread {key[1]}"
        out.append(dict(ph="M", pid=key[0], tid=key[1], name="thread_name", args=dict(name=name)))


_INSTANT, _MESSAGE, _SEGMENT, _OTHER = "instant", "message", "segment", "other"


def _route(kind):
    """How to_chrome draws an event of `kind`: a plain instant, a message slice (X), a segment
    (shm.*: async b/e and n), or one of the rest (pool tasks, locks, a put that failed)."""
    if kind in _MESSAGE_OUT or kind in _MESSAGE_IN:
        return _MESSAGE
    if kind.startswith("shm."):
        return _SEGMENT
    if kind == "queue.put_failed" or kind.startswith(("pool.", "lock.")):
        return _OTHER
    return _INSTANT


def _next_event_ts(events):
    """For each event, the timestamp of the next event in the same thread (or None)."""
    nxt, last = [None] * len(events), {}
    for i, e in enumerate(events):
        j = last.get((e.pid, e.tid))
        if j is not None:
            nxt[j] = e.ts_ns
        last[(e.pid, e.tid)] = i
    return nxt


class _Segments:
    """Each segment's slice (async, cat "shm", id2 = its name) from its shm.create to when it is
    freed, and the "shm bytes live" counter with it -- the rule of the memory map's "freed"
    (analysis.segment_states): a segment with no name to unlink (file_descriptor: torch's, a
    memfd) is freed when no live process maps it any more; a named one when it is unlinked and
    no live process maps it. A process that ends unmaps what it mapped (its exit, or its kill:
    ``ProcessInfo.exit_ns``). Attach, detach, unlink while mapped, a handle: ``n`` instants on
    the slice. A segment never freed is closed at the trace's end (_close_async: open_at_end).
    (Before: a slice ended only at an unlink, so torch's 20,000 DataLoader segments, each
    unmapped by both sides, all read "open at end", 960,000 B "live".)"""

    def __init__(self, out, root, procs, t0, events):
        self.out, self.root, self.t0, self.live_bytes = out, root, t0, 0
        self.segs = {}                   # name -> _Seg, while it is not freed
        # A segment with no name is not freed while a process will still map it: its fd is
        # on its way (torch's resource_sharer holds it until the receiver asks). Its last map:
        self.last_attach = {e.args.get("name"): e.ts_ns for e in compress(
            events, map(_ATTACH.__eq__, map(_KIND, events)))}
        self.exits = sorted((p.exit_ns, p.pid) for p in procs if p.exit_ns is not None)
        self.next_exit = 0

    def event(self, e, ts, a):
        if self.next_exit < len(self.exits) and self.exits[self.next_exit][0] <= e.ts_ns:
            self.ended_by(e.ts_ns)
        name, kind = a.get("name"), e.kind
        seg = self.segs.get(name)
        if kind == "shm.create" and (seg is None or seg.unlinked or not seg.begun):
            # (not begun: an attach was recorded first -- the processes' clocks are read at
            # different moments of the same exchange -- and the slice begins at the create)
            maps = {} if seg is None or seg.unlinked else seg.maps
            seg = self.segs[name] = _Seg(a, e.pid)
            for pid, n in maps.items():
                seg.maps[pid] = seg.maps.get(pid, 0) + n
            self._put(e, ts, "b", name, dict(a))
            self.live_bytes += seg.nbytes
            self._count(ts)
            return
        if seg is None:                            # first seen here (inherited, say): no slice
            seg = self.segs[name] = _Seg(a, None)
        if kind in ("shm.create", "shm.attach"):
            seg.maps[e.pid] = seg.maps.get(e.pid, 0) + 1
        elif kind == "shm.detach":
            seg.maps[e.pid] = max(0, seg.maps.get(e.pid, 0) - 1)
        elif kind == "shm.unlink":
            seg.unlinked = True
            if not seg.mapped():                   # (the usual end of a named segment)
                self._free(name, seg, e.pid, e.tid, ts, dict(a))
                return
        self._put(e, ts, "n", name, dict(a, what=kind))
        if kind == "shm.detach" and self._freed(name, seg, e.ts_ns):
            self._free(name, seg, e.pid, e.tid, ts, {"freed": (
                "unlinked, and no process maps it any more" if seg.named else
                "no process maps it any more (it has no name to unlink)")})

    def ended_by(self, t_ns):
        """The processes that ended by `t_ns` unmap what they still mapped."""
        while self.next_exit < len(self.exits) and self.exits[self.next_exit][0] <= t_ns:
            at, pid = self.exits[self.next_exit]
            self.next_exit += 1
            ts = (at - self.t0) / 1000.0
            for name, seg in [(n, s) for n, s in self.segs.items() if pid in s.maps]:
                if seg.maps.pop(pid) and self._freed(name, seg, at):
                    self._free(name, seg, pid, pid, ts, {"freed": (
                        f"the last process that mapped it ended (pid {pid})")})

    def _freed(self, name, seg, t_ns):
        """Is `seg` freed at `t_ns`, now that one of its maps went away?"""
        if seg.mapped():
            return False
        return seg.unlinked or not seg.named and self.last_attach.get(name, t_ns) <= t_ns

    def _free(self, name, seg, pid, tid, ts, args):
        del self.segs[name]
        if seg.begun:
            self.out.append({"pid": pid, "tid": tid, "ts": ts, "ph": "e", "cat": "shm",
                             "id2": {"global": str(name)}, "name": f"shm {name}",
                             "args": args})
            self.live_bytes -= seg.nbytes
            self._count(ts)

    def _put(self, e, ts, ph, name, args):
        # (dicts written out in the order of their keys in trace.json: pid, tid, ts, ph, ...)
        self.out.append({"pid": e.pid, "tid": e.tid, "ts": ts, "ph": ph, "cat": "shm",
                         "id2": {"global": str(name)}, "name": f"shm {name}", "args": args})

    def _count(self, ts):
        self.out.append({"ph": "C", "pid": self.root, "tid": self.root, "ts": ts,
                         "name": "shm bytes live", "args": {"bytes": self.live_bytes}})


class _Seg:
    """One segment to _Segments: who maps it (pid -> how many times), whether it has a name
    to unlink and was unlinked, its size, and whether its slice began (its create is seen)."""
    __slots__ = ("maps", "named", "unlinked", "nbytes", "begun")

    def __init__(self, a, creator):
        self.named = has_name(a.get("strategy"), a.get("name"))
        self.maps = {} if creator is None else {creator: 1}
        self.unlinked, self.begun = False, creator is not None
        self.nbytes = (a.get("nbytes") or 0) if creator is not None else 0

    def mapped(self):
        return any(self.maps.values())


def _lock(e, base, a, out, _lock_open, name):
    """Lock waits and holds as async slices, one id per (lock, thread, occurrence)."""
    lid, who = a.get("lock"), (e.pid, e.tid)
    key = (lid, who)
    if e.kind == "lock.wait":
        _lock_open[("wait",) + key] = _async(out, base, "lock", f"wait {name}", a)
    elif e.kind in ("lock.acquire", "lock.timeout"):
        w = _lock_open.pop(("wait",) + key, None)
        if w is not None:
            out.append(dict(base, ph="e", cat="lock", id=w, name=f"wait {name}", args=dict(a)))
        if e.kind == "lock.acquire":
            _lock_open.setdefault(("hold",) + key, []).append(
                _async(out, base, "lock", f"hold {name}", a))
    elif e.kind == "lock.release":
        stack = _lock_open.get(("hold",) + key)
        if stack:
            out.append(dict(base, ph="e", cat="lock", id=stack.pop(), name=f"hold {name}",
                            args=dict(a)))
        else:
            out.append(dict(base, ph="i", s="t", cat="lock", name="lock.release", args=dict(a)))


def _async(out, base, cat, name, args):
    ident = f"{cat}-{len(out)}"                 # unique: the position of its "b" event
    out.append(dict(base, ph="b", cat=cat, id=ident, name=name, args=dict(args)))
    return ident


_ASYNC_PHASES, _PHASE = frozenset(("b", "e")), itemgetter("ph")
_ATTACH, _KIND = "shm.attach", attrgetter("kind")


def _close_async(out, end_us):
    """End async slices still open at the end of the trace (a lock still held, a segment
    never unlinked), so every b has its e."""
    opened = {}
    # (only the b and e events, picked out at C speed: most of `out` is neither)
    for ev in compress(out, map(_ASYNC_PHASES.__contains__, map(_PHASE, out))):
        key = (ev["cat"], str(ev.get("id", ev.get("id2"))), ev["name"])
        opened[key] = opened.get(key, 0) + (1 if ev["ph"] == "b" else -1)
        opened.setdefault(("first",) + key, ev)
    for key, n in list(opened.items()):
        if key[0] == "first" or n <= 0:
            continue
        first = opened[("first",) + key]
        for _ in range(n):
            end = {k: v for k, v in first.items() if k not in ("args", "ts", "ph")}
            out.append(dict(end, ph="e", ts=end_us, args={"open_at_end": True}))


def _depth(out, depth, q, change, root, ts):
    """Queue `q`'s depth changes by `change` at `ts`: a counter sample."""
    depth[q] = max(0, depth.get(q, 0) + change)
    out.append(dict(ph="C", pid=root, tid=root, ts=ts, name=f"{q} depth",
                    args={"depth": depth[q]}))
