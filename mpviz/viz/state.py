"""The state of a recorded run at one instant: who is alive, who maps what, who holds what.

Every picture and the Live widget's panels ask the same questions of a trace, so they are
answered once, here, in plain Python (no matplotlib), and can be tested without pictures::

    state = state_at(trace, t_ns)          # t_ns=None: the end of the trace
    state.processes    alive processes, each with its label ("main", "worker 0", "producer")
    state.segments     shared-memory segments that exist, who maps them, and whether leaked
    state.locks        locks that are held or waited for: owners and waiters
    state.in_flight    messages put but not yet got (``Flow``s)
    state.deadlocks    threads that can never go on, each with the reason in words
    print(state.text())

How a lock's owner is found. A ``multiprocessing`` lock is one semaphore shared by every process:
its owner is whoever acquired it last and has not released it. A ``threading`` lock (recorded with
``record(threading_locks=True)``, ids ``t<pid>.<n>``) is private to a process -- but ``fork``
copies the whole memory, so a forked child gets a *copy* of the lock, in the state it had at that
moment. If another thread held it then, the child's copy stays held by a thread that ``fork``
did not copy (only the forking thread survives in the child): a ghost owner. That is the classic
"fork while a thread holds a lock" deadlock, and ``Owner.ghost`` says so in words.

A deadlock is a thread waiting for a lock whose owner can never release it: the owner is a ghost,
the owner's process or thread has ended, or the owners wait on each other in a cycle (found by a
depth-first search over "waiter → owner" edges). A ``watchdog.stuck`` event also counts.

Which messages carried a shared-memory handle (drawn green, counted by ``summary``). The
evidence is what happened right around the message in the same thread:

  * the sender passed a file descriptor (``fd.send``) or exported CUDA memory (``cuda.send``)
    just before its put, or
  * the receiver mapped memory (``shm.attach``), fetched an fd (``fd.recv``) or opened a CUDA
    IPC handle (``cuda.ipc_open``) while unpickling it, just before its get, or
  * real torch (``mpviz.trace.torch_hooks``): ``shm.handle``, recorded as torch's reducer
    returns a handle, in the thread that pickles the message -- a Queue's feeder, so the
    message event that follows is its ``queue.feed``. torch's other events (``torch=True``)
    are not signs: a stdlib Queue's get is recorded as the bytes are read, *before* they are
    unpickled, so a receiver's attach would be taken for a sign of its *next* message.
    A handle sent while a Process starts (spawn arguments) goes with no message: not a sign.
  * a handle sent *again*: the receiver already maps the segment (torch's cache hit, so no
    attach is recorded). Rule: a message of under 1 KiB pickled whose sender maps a segment at
    the put which the receiver maps at the get, and which has the same pickled size as an
    earlier handle message from the same sender on the same channel. A heuristic: a small
    reply of exactly that size would be drawn green too.

The watchdog (a scenario's side process, ``process.start how="watchdog"``) is not a lane of
its own: its ``watchdog.stuck`` / ``watchdog.kill`` events are filed under the pids they name.
"""
import re
import weakref
from dataclasses import dataclass, field
from typing import Optional

from .colors import human_bytes

_THREAD_LOCK = re.compile(r"^t(\d+)\.\d+$")
_SHM_KINDS = frozenset({"shm.create", "shm.attach", "shm.detach", "shm.unlink"})
_HANDLE_SIGNS = frozenset({"shm.attach", "fd.recv", "fd.send", "cuda.send", "cuda.ipc_open",
                           "shm.handle"})
_MESSAGE_ENDS = frozenset({"queue.get", "pipe.recv", "queue.put", "pipe.send", "queue.feed"})
_NEUTRAL = frozenset({"shm.create", "copy", "shm.cache", "cuda.alloc", "cuda.limbo"})
_SMALL_HANDLE = 1024           # a re-sent handle pickles to less than this
# Kinds the timeline draws with glyphs of their own; every other kind is a plain tick.
GLYPH_KINDS = frozenset({
    "process.start", "process.bootstrap", "process.exit", "process.launch", "process.reaped",
    "thread.start", "thread.exit", "queue.put", "queue.get", "pipe.send", "pipe.recv", "copy",
    "lock.wait", "lock.acquire", "lock.release", "lock.timeout", "pool.task", "mark",
    "cuda.warning"})


# --- naming ------------------------------------------------------------------------------------

def process_labels(trace):
    """``{pid: label}``: "main" for the recording process, "worker 0".. for Pool workers, else
    the process's name (``Process(name=...)``), else ``"pid N"``."""
    return _index(trace).labels


def is_thread_lock(lock_id):
    """True for a ``threading`` lock (private to a process; ``fork`` copies it)."""
    return _THREAD_LOCK.match(str(lock_id)) is not None


# --- the records -------------------------------------------------------------------------------

_MAX_RESENT_CHECKS = 2000    # messages examined by the re-sent-handle rule, at most


@dataclass(frozen=True)
class ProcessState:
    pid: int
    label: str
    how: Optional[str]
    threads: tuple                     # (tid, name) of threads alive at the instant


@dataclass(frozen=True)
class SegmentState:
    name: str
    strategy: Optional[str]
    nbytes: Optional[int]
    created_by: Optional[int]
    mapped_by: tuple                   # pids that map it at the instant
    mapped_ever: tuple                 # pids that mapped it at some point up to the instant
    unlinked_by: Optional[int]         # pid that unlinked it (by the instant), or None
    died_holding: tuple                # pids that ended (killed) while still mapping it
    status: str                        # "in use", "unlinked, still mapped", "freed",
                                       # "not mapped yet", "leaked"


@dataclass(frozen=True)
class Owner:
    pid: int
    tid: int
    thread: str
    ghost: Optional[str] = None        # why this owner can never release the lock, or None


@dataclass(frozen=True)
class LockState:
    id: str
    type: Optional[str]
    copy_in: Optional[int]             # a threading lock: the process whose copy this is
    owners: tuple                      # Owner
    waiters: tuple                     # (pid, tid, since_ns)


@dataclass(frozen=True)
class Deadlock:
    pid: int
    tid: int
    reason: str
    cycle: tuple = ()                  # ((pid, tid), lock id, (pid, tid), lock id, ...) if a cycle


@dataclass(frozen=True)
class State:
    t_ns: int
    t0_ns: int
    processes: tuple
    segments: tuple
    locks: tuple
    in_flight: tuple
    deadlocks: tuple
    labels: dict = field(repr=False, default_factory=dict)
    thread_names: dict = field(repr=False, default_factory=dict)

    @property
    def t_s(self):
        """Seconds since the trace began."""
        return (self.t_ns - self.t0_ns) / 1e9

    def alive(self):
        return [p.pid for p in self.processes]

    def text(self):
        """The state in plain words, one line per thing (what the widget's panel shows)."""
        name = lambda pid: f"{self.labels.get(pid, 'pid')} (pid {pid})"  # noqa: E731
        lines = [f"at {self.t_s * 1000:.1f} ms"]
        lines.append(f"Processes alive ({len(self.processes)}): " +
                     (", ".join(name(p.pid) for p in self.processes) or "none"))
        lines.append(f"Shared memory ({len(self.segments)} segments):")
        for s in self.segments:
            maps = ", ".join(self.labels.get(p, str(p)) for p in s.mapped_by) or "nobody"
            lines.append(f"  {s.name.lstrip('/')} [{s.strategy}, {human_bytes(s.nbytes)}] "
                         f"{s.status}; mapped by {maps}")
        lines.append(f"Locks held or waited for ({len(self.locks)}):")
        for lk in self.locks:
            owners = "; ".join(f"{name(o.pid)} {o.thread}" + (f" [GHOST: {o.ghost}]" if o.ghost
                                                                else "") for o in lk.owners)
            waiters = ", ".join(f"{name(p)} {self.thread_names.get((p, t), f'thread {t}')}"
                                for p, t, _ in lk.waiters)
            copy = f", the copy in {name(lk.copy_in)}" if lk.copy_in is not None else ""
            lines.append(f"  {lk.id} ({lk.type}{copy}): held by {owners or 'nobody'}; "
                         f"waiting: {waiters or 'nobody'}")
        lines.append(f"Messages in flight ({len(self.in_flight)}):")
        for f in self.in_flight:
            lines.append(f"  {name(f.put.pid)} put {f.put.args.get('msg')} on {f.channel} "
                         f"({human_bytes(f.nbytes)})")
        if self.deadlocks:
            lines.append("STUCK FOR GOOD:")
            lines.extend(f"  {name(d.pid)}: {d.reason}" for d in self.deadlocks)
        return "\n".join(lines)


# --- the index: one pass over the events, cached per trace -----------------------------------

_cache = weakref.WeakKeyDictionary()


def _index(trace):
    """The per-trace index, rebuilt when the trace has grown (``refresh()``)."""
    key = (len(trace.events), trace.events[-1].ts_ns if trace.events else 0)
    found = _cache.get(trace)
    if found is None or found.key != key:
        found = _Index(trace, key)
        _cache[trace] = found
    return found


class _Index:
    def __init__(self, trace, key):
        self.key = key
        events = trace.events
        self.t0 = events[0].ts_ns if events else 0
        self.t1 = events[-1].ts_ns if events else 0
        self.procs = {p.pid: p for p in trace.processes()}
        self.watchdogs = {pid for pid, p in self.procs.items() if p.how == "watchdog"}
        self.tasks = []                # (pid, tid, start_ns, done_ns) of Pool tasks
        open_tasks = {}
        self.flows = trace.flows()
        self.lock_infos = {lk.id: lk for lk in trace.locks()}
        self.threads, self.thread_end, self.forker = {}, {}, {}
        self.shm, self.waits, self.stuck = [], [], []
        open_waits, pending = {}, {}
        self.busy, self.first_seen, self.by_kind, self.ticks = {}, {}, {}, {}
        self.handles = set()           # message ids that carried shared-memory handles
        self.dataloader_workers = {}   # pid -> worker_id, from real torch's DataLoader
        self.torch_segments = set()    # names of real torch's segments (their unlink is unseen)
        self.torch_unseen = []         # (pid, why) where torch's sharing was NOT recorded
        self.fd_messages = {}          # torch: resource_sharer token -> the message it serves
        special = {"copy", "cuda.warning", "pool.task", "mark"}
        for e in events:
            k = e.kind
            who = (e.pid, e.tid)
            if e.pid in self.watchdogs:                 # file its findings under their pids
                named = e.args.get("pids") or [e.args.get("pid")]
                for pid in named if isinstance(named, (list, tuple)) else [named]:
                    if pid in self.procs and k not in GLYPH_KINDS:
                        self.ticks.setdefault((pid, pid), []).append(e.ts_ns)
                if k == "watchdog.stuck":
                    self.stuck.append(e)
                continue
            if who not in self.first_seen:
                self.first_seen[who] = e.ts_ns
            if e.tid != e.pid and k != "thread.start" and k != "thread.exit":
                self.busy[who] = self.busy.get(who, 0) + 1
            if k in special:
                self.by_kind.setdefault(k, []).append(e)
            elif k not in GLYPH_KINDS:
                self.ticks.setdefault(who, []).append(e.ts_ns)
            # a message carried handles if its unpickling mapped memory or fetched an fd
            # (get side), or an fd.send came just before its put in the same thread
            if e.args.get("torch") and (k != "shm.handle" or
                                        e.args.get("via") == "process start"):
                self._torch_event(e)                    # (see _HANDLE_SIGNS: not a sign)
            elif k in _HANDLE_SIGNS:
                signs = pending.setdefault(who, [])
                if k == "shm.handle" and e.args.get("token"):
                    signs.append(e.args["token"])      # torch: the fd resource_sharer will send
            elif k in _MESSAGE_ENDS:
                signs = pending.pop(who, None)
                if signs is not None:
                    self.handles.add(e.args.get("msg"))
                    for token in signs:
                        self.fd_messages[token] = e.args.get("msg")
            elif pending and k not in _NEUTRAL:
                pending.pop(who, None)
            if k == "thread.start":
                self.threads[(e.pid, e.tid)] = e.args.get("name")
            elif k == "thread.exit":
                self.thread_end[(e.pid, e.tid)] = e.ts_ns
            elif k == "process.launch":
                self.forker[e.args.get("child")] = (e.pid, e.tid, e.ts_ns)
            elif k in _SHM_KINDS:
                self.shm.append(e)
            elif k == "lock.wait":
                open_waits[(e.args["lock"], e.pid, e.tid)] = e.ts_ns
            elif k in ("lock.acquire", "lock.timeout"):
                since = open_waits.pop((e.args["lock"], e.pid, e.tid), None)
                if since is not None:
                    self.waits.append((e.args["lock"], e.pid, e.tid, since, e.ts_ns))
            elif k == "watchdog.stuck":
                self.stuck.append(e)
            elif k == "pool.task":
                key = (e.pid, e.args.get("job"), e.args.get("index"))
                if e.args.get("phase") == "start":
                    open_tasks[key] = e
                elif e.args.get("phase") == "done" and key in open_tasks:
                    self.tasks.append((e.pid, e.tid, open_tasks.pop(key).ts_ns, e.ts_ns))
        self._resent_handles()
        for (lid, pid, tid), since in open_waits.items():
            self.waits.append((lid, pid, tid, since, None))
        self.labels = _make_labels(self.procs, self.watchdogs)
        for pid, worker_id in self.dataloader_workers.items():
            self.labels[pid] = f"DataLoader worker {worker_id}"

    def _torch_event(self, e):
        """What real torch's events add to the index: DataLoader workers, torch segments."""
        if e.kind == "dataloader.worker":
            self.dataloader_workers[e.pid] = e.args.get("worker_id")
        elif e.kind in _SHM_KINDS:
            self.torch_segments.add(e.args.get("name"))
        elif e.kind in ("torch.unsupported", "torch.hook_failed"):
            self.torch_unseen.append((e.pid, e.args.get("reason")))

    def _resent_handles(self):
        """Add to ``handles`` the small messages that re-send a handle (see the module text)."""
        sizes = {}                                   # (sender, channel) -> handle msg sizes
        for f in self.flows:
            if f.put.args.get("msg") in self.handles and f.nbytes is not None:
                sizes.setdefault((f.put.pid, f.channel), set()).add(f.nbytes)
        maybe = [f for f in self.flows if f.get is not None and f.nbytes is not None
                 and f.nbytes < _SMALL_HANDLE and f.put.args.get("msg") not in self.handles
                 and f.nbytes in sizes.get((f.put.pid, f.channel), ())]
        if not maybe or not self.shm or len(maybe) > _MAX_RESENT_CHECKS:
            return   # a huge trace is drawn aggregated anyway: its arrows are bundled, not coloured one by one
        # one sweep over the mapping events answers "what does pid map at t?" for each message
        asks = sorted([(f.put.ts_ns, i, "put") for i, f in enumerate(maybe)] +
                      [(f.get.ts_ns, i, "get") for i, f in enumerate(maybe)])
        counts, live, seen, j = {}, {}, {}, 0     # live: pid -> names it maps right now
        for t, i, end in asks:
            while j < len(self.shm) and self.shm[j].ts_ns <= t:
                e = self.shm[j]
                j += 1
                key = (e.pid, e.args.get("name"))
                if e.kind in ("shm.create", "shm.attach"):
                    counts[key] = counts.get(key, 0) + 1
                    live.setdefault(e.pid, set()).add(key[1])
                elif e.kind == "shm.detach" and counts.get(key, 0) > 0:
                    counts[key] -= 1
                    if not counts[key]:
                        live[e.pid].discard(key[1])
            f = maybe[i]
            if end == "put":
                seen[i] = frozenset(live.get(f.put.pid, ()))
            elif not seen.get(i, frozenset()).isdisjoint(live.get(f.get.pid, ())):
                self.handles.add(f.put.args.get("msg"))

    def thread_name(self, pid, tid):
        if tid == pid:
            return "main thread"
        return self.threads.get((pid, tid)) or f"thread {tid}"

    def alive(self, pid, t):
        p = self.procs.get(pid)
        return p is not None and p.start_ns <= t and (p.exit_ns is None or t < p.exit_ns)

    def thread_alive(self, pid, tid, t):
        end = self.thread_end.get((pid, tid))
        return self.alive(pid, t) and (end is None or t < end)

    # --- locks ---

    def owners(self, lid, pid, t, _depth=0):
        """Owners of lock `lid` at `t`; for a threading lock, as seen by `pid`'s copy."""
        info = self.lock_infos.get(lid)
        holds = info.holds if info else ()
        active = [h for h in holds if h.acquire_ns <= t and (h.release_ns is None or
                                                            t < h.release_ns)]
        if not is_thread_lock(lid):
            return [self._owner(h.pid, h.tid, t) for h in active]
        found = [Owner(h.pid, h.tid, self.thread_name(h.pid, h.tid)) for h in active
                 if h.pid == pid]
        parent = self.forker.get(pid)
        proc = self.procs.get(pid)
        if parent and proc is not None and proc.how == "fork" and _depth < 8:
            ppid, forking_tid, fork_ns = parent
            for o in self.owners(lid, ppid, fork_ns, _depth + 1):
                if o.tid == forking_tid:     # the forking thread is the child's main thread
                    found.append(Owner(pid, pid, "main thread (held it when it forked)"))
                else:
                    who = f"{self.labels.get(ppid, ppid)}'s thread '{o.thread}'"
                    found.append(Owner(o.pid, o.tid, o.thread, ghost=(
                        f"{who} held this lock when {self.labels.get(ppid, ppid)} forked; fork "
                        f"copied the lock but not that thread, so in "
                        f"{self.labels.get(pid, pid)} nobody will ever release it")))
        return found

    def _owner(self, pid, tid, t):
        name = self.thread_name(pid, tid)
        ghost = None
        if not self.alive(pid, t):
            ghost = f"{self.labels.get(pid, pid)} (pid {pid}) ended while holding it"
        elif not self.thread_alive(pid, tid, t):
            ghost = f"its owner, {name} of {self.labels.get(pid, pid)}, ended while holding it"
        return Owner(pid, tid, name, ghost)

    def lock_states(self, t):
        waiting = {}
        for lid, pid, tid, since, until in self.waits:
            if since <= t and (until is None or t < until) and self.thread_alive(pid, tid, t):
                copy = pid if is_thread_lock(lid) else None
                waiting.setdefault((lid, copy), []).append((pid, tid, since))
        keys = set(waiting)
        for lid, info in self.lock_infos.items():
            for h in info.holds:
                if h.acquire_ns <= t and (h.release_ns is None or t < h.release_ns):
                    keys.add((lid, h.pid if is_thread_lock(lid) else None))
        out = []
        for lid, copy in sorted(keys, key=str):
            info = self.lock_infos.get(lid)
            owners = self.owners(lid, copy, t)
            if copy is not None and not self.alive(copy, t):
                continue
            out.append(LockState(lid, info.type if info else None, copy if copy is not None
                                 and str(copy) != _THREAD_LOCK.match(lid).group(1) else None,
                                 tuple(owners), tuple(waiting.get((lid, copy), ()))))
        return out

    def deadlocks(self, locks, t):
        found, edges = {}, {}
        for lk in locks:
            for pid, tid, _ in lk.waiters:
                for o in lk.owners:
                    if o.ghost:
                        found.setdefault((pid, tid), Deadlock(pid, tid, (
                            f"{self.thread_name(pid, tid)} waits forever for lock {lk.id}: "
                            f"{o.ghost}")))
                    else:
                        edges.setdefault((pid, tid), []).append((lk.id, (o.pid, o.tid)))
        for cycle in _cycles(edges):
            who = lambda n: f"{self.labels.get(n[0], n[0])}'s {self.thread_name(*n)}"  # noqa
            steps = [f"{who(cycle[i])} waits for lock {cycle[i + 1]}, which "
                     f"{who(cycle[i + 2])} holds" for i in range(0, len(cycle) - 1, 2)]
            reason = "a cycle: " + "; ".join(steps) + ". Each waits for the next: none can go on"
            for node in cycle[::2]:
                found.setdefault(node, Deadlock(node[0], node[1], reason, tuple(cycle)))
        for e in self.stuck:
            pid = e.args.get("pid", e.pid)
            if e.ts_ns <= t and (pid, pid) not in found and not any(k[0] == pid for k in found):
                found[(pid, pid)] = Deadlock(pid, pid, "the watchdog found it stuck" +
                                             _last_frame(e.args.get("stacks")))
        return list(found.values())

    # --- segments ---

    def segment_states(self, t):
        """Every segment created (or first seen) by `t`, with its status at `t`."""
        segs, order = {}, []
        for e in self.shm:
            if e.ts_ns > t:
                break
            name = e.args.get("name")
            s = segs.get(name)
            if s is None or (e.kind == "shm.create" and s["unlinked_by"] is not None):
                s = segs[name] = dict(name=name, strategy=e.args.get("strategy"),
                                      nbytes=e.args.get("nbytes"), created_by=None, maps={},
                                      ever=[], unlinked_by=None)
                order.append(s)
            if e.kind in ("shm.create", "shm.attach"):
                if e.kind == "shm.create":
                    s["created_by"] = e.pid
                s["maps"][e.pid] = s["maps"].get(e.pid, 0) + 1
                if e.pid not in s["ever"]:
                    s["ever"].append(e.pid)
            elif e.kind == "shm.detach":
                s["maps"][e.pid] = max(0, s["maps"].get(e.pid, 0) - 1)
            elif e.kind == "shm.unlink":
                s["unlinked_by"] = e.pid
        later_attach = {e.args.get("name") for e in self.shm if e.ts_ns > t and
                        e.kind == "shm.attach"}
        out = []
        for s in order:
            mapped = tuple(p for p, n in s["maps"].items() if n > 0 and self.alive(p, t))
            died = tuple(p for p, n in s["maps"].items() if n > 0 and not self.alive(p, t)
                         and (s["name"] not in self.torch_segments or self.procs[p].signal))
            # (torch unmaps in C++, unseen: a torch segment's holder that ended by itself let go
            # at its exit; only one killed by a signal is said to have died holding it)
            named = s["strategy"] in ("file_system", None) or str(s["name"]).startswith(
                ("/mpviz_fs", "mpviz_fs"))
            if mapped:
                status = "in use" if s["unlinked_by"] is None or not named else \
                    "unlinked, still mapped"
            elif s["unlinked_by"] is not None or not named:
                status = "freed"
            elif s["name"] in later_attach:
                status = "not mapped yet"
            elif s["name"] in self.torch_segments:   # torch's manager unlinks it, unseen by us
                status = "unlink not seen (torch)"
            else:
                status = "leaked"
            out.append(SegmentState(s["name"], s["strategy"], s["nbytes"], s["created_by"],
                                    mapped, tuple(s["ever"]), s["unlinked_by"], died, status))
        return out


def _make_labels(procs, watchdogs=()):
    labels, workers = {}, 0
    roots = [p for p in procs.values() if (p.ppid not in procs or p.ppid in watchdogs)
             and p.pid not in watchdogs]
    for p in procs.values():
        name = p.name or ""
        if p.pid in watchdogs:
            labels[p.pid] = "watchdog"
        elif p in roots:                          # the process that recorded (or the CLI's
            labels[p.pid] = "main" if p is roots[0] else f"main {p.pid}"   # program)
        elif "PoolWorker" in name:
            labels[p.pid] = f"worker {workers}"
            workers += 1
        elif name and name != "MainProcess":
            labels[p.pid] = name
        else:
            labels[p.pid] = f"pid {p.pid}"
    return labels


def _cycles(edges):
    """Cycles in a waiter → [(lock, owner)] graph, each as (node, lock, node, lock, ..., node)."""
    found, seen_sets = [], set()
    for start in list(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for lid, nxt in edges.get(node, ()):
                if nxt == start:
                    cyc = tuple(path[:1] + path[1:]) + (lid, start)
                    nodes = frozenset(cyc[::2])
                    if nodes not in seen_sets:
                        seen_sets.add(nodes)
                        found.append(cyc)
                elif nxt not in path[::2] and len(path) < 40:
                    stack.append((nxt, path + [lid, nxt]))
    return found


def _last_frame(stacks):
    if not stacks:
        return ""
    text = stacks if isinstance(stacks, str) else str(stacks)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("File")]
    return f" (at {lines[0]})" if lines else ""


# --- the public question ---------------------------------------------------------------------

def fd_message(trace, event):
    """The message id whose handle a torch ``fd.send``/``fd.recv`` `event` served (None if
    unknown): resource_sharer hands the fd over later, in another thread, so the event names
    the token of the handle, and the handle's message is known by the token."""
    return _index(trace).fd_messages.get(event.args.get("token"))


def torch_not_recorded(trace):
    """Why real torch's sharing is missing from this trace, in words ("" if nothing is): a
    torch version mpviz does not hook, or a hook that failed and turned itself off."""
    unseen = _index(trace).torch_unseen
    if not unseen:
        return ""
    pids = sorted({pid for pid, _ in unseen})
    return (f"torch's shared memory was NOT recorded in {len(pids)} process"
            f"{'es' * (len(pids) > 1)}: {unseen[0][1]}. Its segments, copies and handles are "
            f"unknown, not zero")


def trace_span(trace):
    """``(first_ns, last_ns)`` of the trace's events."""
    ix = _index(trace)
    return ix.t0, ix.t1


def state_at(trace, t_ns=None):
    """The ``State`` at instant `t_ns` (``time.monotonic_ns()`` clock); None: the trace's end."""
    ix = _index(trace)
    t = ix.t1 if t_ns is None else int(t_ns)
    procs = tuple(ProcessState(p.pid, ix.labels[p.pid], p.how,
                               tuple((tid, ix.thread_name(p.pid, tid)) for tid in p.threads
                                     if ix.thread_alive(p.pid, tid, t)))
                  for p in ix.procs.values() if ix.alive(p.pid, t))
    locks = ix.lock_states(t)
    in_flight = tuple(f for f in ix.flows
                      if f.put.ts_ns <= t and (f.get is None or f.get.ts_ns > t))
    return State(t, ix.t0, procs, tuple(ix.segment_states(t)), tuple(locks), in_flight,
                 tuple(ix.deadlocks(locks, t)), dict(ix.labels),
                 {(p, t): ix.thread_name(p, t) for p in ix.procs for t in ix.procs[p].threads})


def stuck_moment(trace):
    """The instant to judge a deadlock at: just before the first still-waiting thread's process
    ended (a watchdog or a test kills stuck processes), or the trace's end; None if no thread was
    left waiting."""
    ix = _index(trace)
    open_waits = [(pid, since) for _, pid, _, since, until in ix.waits if until is None]
    if not open_waits:
        return ix.t1 if ix.stuck else None
    ends = [ix.procs[pid].exit_ns for pid, _ in open_waits
            if pid in ix.procs and ix.procs[pid].exit_ns is not None]
    latest_start = max(since for _, since in open_waits)
    if ends:
        return max(latest_start, min(ends) - 1)
    return ix.t1


def deadlocks(trace):
    """The ``Deadlock``s of the whole run (judged at ``stuck_moment``), or ``[]``."""
    t = stuck_moment(trace)
    return [] if t is None else list(state_at(trace, t).deadlocks)
