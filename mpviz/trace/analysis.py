"""The state of a recorded run at one instant: who is alive, who maps what, who holds what.

The pictures (viz/), the Live widget and the hang verdicts (watchdog.py) ask the same questions
of a trace: answered once, here beside ``Trace``, in plain Python (testable without pictures)::

    state = state_at(trace, t_ns)          # t_ns=None: the end of the trace
    state.processes    alive processes, each with its label ("main", "worker 0", "producer")
    state.segments     shared-memory segments that exist, who maps them, and whether leaked
    state.locks        locks that are held or waited for: owners and waiters
    state.in_flight    messages put but not yet got (``Flow``s)
    state.blocked      threads blocked in a recorded wait (a join, q.join, Event.wait, a full
                       pipe ...): on what, since when, and who must act so that they go on
    state.deadlocks    threads that can never go on, with the reason (an idle Pool worker is
                       not one: idle_pool_workers)
    print(state.text())
    failures(trace)    actions that failed (a put or get that raised, a thread that raised, ...)

Names are for people (mpviz/trace/names.py, shared with trace.json): a lock is called by the
variable the waiting code used for it (or "Queue 1's lock", "Lock 2"), a queue "Queue 1" or
"the Pool's result queue", and a stuck process's reason points at the user's line in its stack
(``user_line``), not at the stdlib's or mpviz's frame it sat in.

How each answer is found is told where it is worked out: a lock's owner (and its ghost) at
``Owner``, deadlocks at ``Deadlock``, who must act for a blocked thread at ``Blocked``, which
messages carried handles above ``_Index``.
"""
import os
import re
import weakref
from dataclasses import dataclass, field
from typing import Optional

from . import names
from .events import Request, has_name
from .names import human_bytes, is_thread_lock, join_ends
from .trace import without_gc

_THREAD_LOCK = re.compile(r"^t(\d+)\.\d+$")
_SHM_KINDS = frozenset({"shm.create", "shm.attach", "shm.detach", "shm.unlink"})
_SENDS = frozenset({"queue.put", "queue.feed", "pipe.send"})   # put-side events of a message
# Kinds the timeline draws with glyphs of their own; every other kind is a plain tick.
GLYPH_KINDS = frozenset({
    "process.start", "process.bootstrap", "process.exit", "process.launch", "process.reaped",
    "thread.start", "thread.exit", "queue.put", "queue.get", "pipe.send", "pipe.recv", "copy",
    "lock.wait", "lock.acquire", "lock.release", "lock.timeout", "pool.task", "mark",
    "cuda.warning", "queue.put_failed", "queue.get_failed", "wait.begin", "wait.end",
    "dist.rendezvous", "dist.collective"})        # (drawn as bars: viz/collectives.py)
PIPE_BYTES = 64 * 1024         # what a Linux pipe holds before a write waits for a reader
# What the one who must act has to do, per kind of wait (the wait-for graph's arrow, a verdict).
MUST = {"process": "must exit", "thread": "must finish", "pipe.write": "must read",
        "queue.join": "must call task_done()", "pool.result": "must finish its task",
        "queue.get": "must put", "queue.put": "must get", "future": "runs it and must finish it",
        "pipe.recv": "must send", "pipe.send": "must recv", "thread_queue.get": "must put",
        "thread_queue.join": "must call task_done()", "thread_queue.put": "must get"}
# A wait through a Manager's proxy, by (its object's type, the method): the methods whose call
# by another thread ends it, what that thread must do, and what the wait is, in words.
_QUEUES = ("Queue", "JoinableQueue")
_PROXY_MUST = {
    **{(q, "get"): (("put", "put_nowait"), "must put", "nothing in it") for q in _QUEUES},
    **{(q, "put"): (("get", "get_nowait"), "must get", "it is full") for q in _QUEUES},
    ("JoinableQueue", "join"): (("get", "get_nowait"), "must call task_done()",
                                "until every item is task_done()"),
    ("Event", "wait"): (("set",), "must call set()", "it is not set"),
    ("Condition", "wait"): (("notify", "notify_all"), "must call notify()", ""),
    ("Condition", "wait_for"): (("notify", "notify_all"), "must call notify()", ""),
    **{(lk, "acquire"): (("acquire",), "called its acquire() before: the one that holds it "
                                       "must release it", "it is taken")
       for lk in ("Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition")},
}


# --- naming ------------------------------------------------------------------------------------

def process_labels(trace):
    """``{pid: label}``: "main" for the recording process, "worker 0".. for Pool workers, else
    the process's name (``Process(name=...)``), else ``"pid N"``."""
    return _index(trace).labels


def channel_names(trace):
    """``{queue or pipe id: "Queue 1"}``: channels numbered in the order their first message was
    put (ids like ``sem-7ff16e9d8000`` or ``mp-9mj2ozka`` mean nothing to a reader)."""
    return _index(trace).channel_names


def lock_name(trace, lock_id):
    """A reader's name for a lock: the variable the waiting code called it by, where the
    recorder saw one ("lock '_library_lock'"); a Queue's own lock ("Queue 1's lock"); else its
    type and a number in order of first use ("Lock 2")."""
    return _index(trace).lock_name(lock_id)


def failures(trace):
    """The actions that failed, each ``Failure(ts_ns, pid, tid, what)`` (see ``_Index``)."""
    return list(_index(trace).failures)


# --- the records -------------------------------------------------------------------------------

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
                                       # "not mapped yet", "in flight?", "leaked",
                                       # "unlink not seen (torch)"


@dataclass(frozen=True)
class Owner:
    """One owner of a lock at the instant.

    How a lock's owner is found. A ``multiprocessing`` lock is one semaphore shared by every
    process: its owner is whoever acquired it last and has not released it. A ``threading`` lock
    (recorded with ``record(threading_locks=True)``, ids ``t<pid>.<n>``) is private to a process
    -- but ``fork`` copies the whole memory, so a forked child gets a *copy* of the lock, in the
    state it had at that moment. If another thread held it then, the child's copy stays held by
    a thread that ``fork`` did not copy (only the forking thread survives in the child): a ghost
    owner. That is the classic "fork while a thread holds a lock" deadlock, and ``Owner.ghost``
    says so in words.
    """
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
    name: str = ""                     # for people: "lock '_library_lock'", "Queue 1's lock"


@dataclass(frozen=True)
class Failure:
    """An action that failed, drawn as ✗ on its lane: a put or get that raised, a step a program
    marked ``failed=...``, a write that blocked on a full pipe in a process found stuck."""
    ts_ns: int
    pid: int
    tid: int
    what: str


@dataclass(frozen=True)
class Blocked:
    """A thread inside a recorded wait at the instant (see mpviz.trace.waits).

    Who must act for a blocked thread to go on (``Blocked.waits_for``), from the ``wait.begin``
    event's ``on`` and ``id`` (mpviz.trace.waits):

        process      join: the child's main thread must finish (and the child exit)
        thread       a process at exit joins its queue's feeder thread: that thread must finish
        pipe.write   the pipe is full: a reader of that queue must read (the threads that have
                     got from it so far, even ended ones; none: nobody has read it yet)
        queue.join   every item put must be marked task_done(): by the threads that got from it
                     (even ended ones: a consumer that ended without task_done() is the story)
        queue.get    the queue is empty: a thread that has put into it must put again (those
                     that have put so far, even ended ones; none: nobody has put into it yet)
        queue.put    the bounded queue is full: a thread that has got from it must get again
        pipe.recv    a recv() on one end of the program's Pipe, nothing to read: whoever holds
                     the other end must send (the threads that have sent on it so far; the
                     children and threads given it as an argument; else the thread that made
                     the Pipe -- never the waiting thread itself)
        pipe.send    a send() into a full Pipe: whoever holds the other end must recv (the
                     threads that have received from this end so far; the children given the
                     other end; else the thread that made the Pipe)
        pool.result  the Pool workers running that job's tasks at the instant
        future       the worker (a ProcessPoolExecutor's process, recorded executor.task) or
                     the thread (a ThreadPoolExecutor's) running that task at the instant
        proxy        a Manager's object, through a proxy: the threads that called the method
                     that ends the wait before (a Queue's get: those that put into it ...; see
                     _PROXY_MUST); the server thread that runs the call is the Manager's own
        event        nobody has set it yet, or who cleared it after its last set (event.set,
                     event.clear: waits.py); whoever will set it again is not recorded
        condition    nobody has notified it yet, or its last notify came before this wait
                     began (the lost wake-up); whoever will notify it is not recorded
        barrier: whoever will arrive is not recorded
    `must`: what they must do, where it is not MUST's for `on`; `nobody`: what the line says
    when nobody is known to act (a task no worker has taken yet).
    """
    pid: int
    tid: int
    on: str                            # process, thread, pipe.write, queue.join, event, ...
    target: object                     # what it waits on: a pid, an OS thread id, a queue id ...
    since_ns: int
    what: str                          # in words: "join producer (pid 12)"
    waits_for: tuple                   # (pid, tid) of the threads that must act, if known
    must: str = ""                     # "must put", where MUST[on] does not say it (proxy ...)
    nobody: str = ""                   # the words for no one known to act, where known better


@dataclass(frozen=True)
class LostTask:
    """A Pool task whose worker ended while running it: its result never comes."""
    pid: int
    label: str                         # "worker 0"
    exitcode: Optional[int]
    signal: Optional[str]
    job: object
    index: object
    func: Optional[str]

    def words(self):
        """"worker 0 exited (exit 1) while running job 0: Pool waits for its result for ever"."""
        how = (f"was killed ({self.signal})" if self.signal else
               f"exited (exit {self.exitcode})" if self.exitcode is not None else "ended")
        return (f"{self.label} {how} while running job {self.job}: Pool waits for its result "
                f"for ever")


@dataclass(frozen=True)
class Deadlock:
    """A thread that can never go on, and why.

    A deadlock is a thread waiting for a lock whose owner can never release it: the owner is a
    ghost, the owner's process or thread has ended, or the owners wait on each other in a cycle
    (found by a depth-first search over "waiter → owner" edges). A ``watchdog.stuck`` event also
    counts.
    """
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
    channel_names: dict = field(repr=False, default_factory=dict)
    blocked: tuple = ()
    ended: dict = field(repr=False, default_factory=dict)   # pid -> "killed by SIGKILL" ... of
                                                            # each process ended by the instant
    idle: frozenset = frozenset()      # Pool / executor workers waiting for their next task
    dropped: dict = field(repr=False, default_factory=dict)  # queue id -> [(pid, error)]: puts
                                                   # its feeder could not pickle (dropped_by_queue)

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
            lines.append(f"  {lk.name or lk.id} ({lk.type}{copy}): held by {owners or 'nobody'}; "
                         f"waiting: {waiters or 'nobody'}")
        lines.append(f"Messages in flight ({len(self.in_flight)}):")
        for f in self.in_flight:
            lines.append(f"  {name(f.put.pid)} put a message on "
                         f"{self.channel_names.get(f.channel, f.channel)} "
                         f"({human_bytes(f.nbytes)})")
        lines.append(f"Threads blocked in a wait ({len(self.blocked)}):")
        for b in self.blocked:
            lines.append(f"  {name(b.pid)} {self.thread_names.get((b.pid, b.tid), 'thread')}: "
                         f"{b.what}, for {(self.t_ns - b.since_ns) / 1e6:.1f} ms")
        if self.deadlocks:
            lines.append("STUCK FOR GOOD:")
            lines.extend(f"  {name(d.pid)}: {d.reason}" for d in self.deadlocks)
        return "\n".join(lines)


# --- the index: one pass over the events, cached per trace -----------------------------------
#
# Which messages carried shared-memory handles (drawn green, counted by ``summary``): the
# sender says so. Pickling a message counts the handles the reducers made (a tensor's storage, a
# CUDA block), and the message's put-side event carries that count (``handles=N`` on
# ``queue.put``, ``queue.feed`` or ``pipe.send``; writer.c's feeder records it as a
# ``queue.handles`` event just before its ``queue.feed``). A message is classified by what it
# carried, never by what happened around it: a receiver that maps memory while unpickling a
# tensor and then puts a small report sends a pickled report, not a handle.
#
# Real torch (``mpviz.trace.torch_hooks``) counts its handles the same way: its reducer,
# wrapped, counts one per storage it shares, in the thread that pickles (a Queue's feeder), and
# records ``shm.handle`` (with resource_sharer's token for an fd) just before that message's
# put-side event; ``fd_messages`` links each fd hand-over to its message that way. A handle sent
# while a Process starts (spawn arguments) goes with no message.
#
# The watchdog (a scenario's side process, ``process.start how="watchdog"``) is not a lane of
# its own: its ``watchdog.stuck`` / ``watchdog.kill`` events are filed under the pids they name.

_WATCHDOG_KINDS = frozenset({"watchdog.stuck", "watchdog.kill", "process.reaped",
                             "process.start"})


def _watchdogs_own(e):
    """Is `e` the watchdog's, in a process that records too? (record(hang_after=S) runs its
    watchdog in the recording process itself: that process is a lane, and only these events of
    it are the watchdog's.)"""
    k = e.kind
    return (k == "watchdog.stuck" or k == "watchdog.kill" or
            (k == "process.reaped" and e.args.get("by") == "watchdog") or
            (k == "process.start" and e.args.get("how") == "watchdog"))


_cache = weakref.WeakKeyDictionary()


def _index(trace):
    """The per-trace index, rebuilt when the trace has grown (``refresh()``)."""
    key = (len(trace.events), trace.events[-1].ts_ns if trace.events else 0)
    found = _cache.get(trace)
    if found is None or found.key != key:
        with without_gc():        # (many small objects, no cycles: see trace.without_gc)
            found = _Index(trace, key)
        _cache[trace] = found
    return found


class _Index:
    def __init__(self, trace, key):
        self.key = key
        self._states_at = {}           # t -> segment_states(t), once asked
        events = trace.events
        self.t0 = events[0].ts_ns if events else 0
        self.t1 = events[-1].ts_ns if events else 0
        self.procs = {p.pid: p for p in trace.processes()}
        self.watchdogs = {pid for pid, p in self.procs.items() if p.how == "watchdog"}
        self.tasks = []                # (pid, tid, start_ns, done_ns) of Pool tasks
        self.failed_tasks = []         # the same, for the tasks whose function raised
        self.scripts = {}              # pid -> the script a traced program ran (its lane's name)
        open_tasks = {}
        self.flows = trace.flows()
        self.lock_infos = {lk.id: lk for lk in trace.locks()}
        self.threads, self.thread_end, self.forker = {}, {}, {}
        self.shm, self.waits, self.stuck = [], [], []
        self.kill_ns = None            # when a watchdog began to kill (watchdog.kill's at_ns)
        self.blocked = []              # (pid, tid, begin event, end ts or None): recorded waits
        self.gave_up = set()           # id() of the wait.begin of each wait that timed out
        self.getters = {}              # queue id -> [(pid, tid, ts) of its first get per thread]
        self.putters = {}              # queue id -> [(pid, tid, ts) of its first put per thread]
        self.tqueue_names = {}         # a queue.Queue's id (tq-PID-N) -> "queue.Queue 1"
        self.tqueue_given = {}         # a queue.Queue's id -> the threads given it as an argument
        self.pipe_of = {}              # a SimpleQueue's id -> its pipe's (its sends are there)
        self.managers = {}             # pid -> the address a Manager's server process serves
        self.proxy_users = {}          # (manager address, token id) -> [(pid, tid, ts, method)]
        self.proxy_names = {}          # (manager address, token id) -> "Queue 1" (per type)
        self.executor_workers = {}     # pid -> its ProcessPoolExecutor's call queue id
        self.given = {}                # queue id -> pids of the children given it as an argument
                                       # (a Pipe end's id too)
        self.pipes = {}                # a Pipe end's id -> (both ends' ids): pipe.open
        self.connections = set()       # the ends of Listener/Client connections among them
        self.pipe_maker = {}           # a Pipe end's id -> (pid, tid) of the thread that made it
        self.given_threads = {}        # a Pipe end's id -> (pid, tid) of threads given it
        self.signals = {}              # ("event"/"condition", id) -> its set/clear/notify events
        self.exit_errors = {}          # pid -> the exception that ended its run() ("X: ...")
        self.crash_at = {}             # pid -> the line it crashed at ("x.py:12 in f(): `...`")
        self.thread_errors = []        # (pid, tid, name, error, at, ts) of threads an
                                       # exception ended
        open_waits, counted, open_blocks = {}, {}, {}
        firsts = set()                 # (a get?, queue or pipe id, (pid, tid)) in getters/putters
        recv_pipes = {}                # (pid, tid) -> the pipes it read messages from
        self.busy, self.first_seen, self.by_kind, self.ticks = {}, {}, {}, {}
        self.event_sets = []           # every event.set (who set an Event, when)
        self.handles = {}              # message id -> how many handles its sender pickled in it
        self.writes = {}               # message id -> (its queue.feed,) when a feeder wrote it
        special = {"copy", "cuda.warning", "pool.task", "pool.terminate", "executor.task", "mark",
                   "queue.put_failed",
                   "queue.get_failed", "dist.rendezvous"}
        self.lock_names = {}           # lock id -> the variable name a waiter used for it
        self.dataloader_workers = {}   # pid -> worker_id, from real torch's DataLoader
        self.dataloader_queues = {}    # the data queue's id -> pids of the workers that put there
        self.torch_segments = set()    # names of real torch's segments (their unlink is unseen)
        self.unmap_unseen = set()      # names of segments unmapped unseen: torch's, and the
                                       # stdlib heap's arenas (sharedctypes: hooks.py)
        self.torch_unseen = []         # (pid, why) where torch's sharing was NOT recorded
        self.fd_messages = {}          # an fd hand-over (_fd_key) -> the message it serves
        tokens = {}                    # (pid, tid) -> fd hand-overs waiting for their message
        fds = {}                       # _fd_key -> {"fd.send": event, "fd.recv": event}
        for e in events:
            k = e.kind
            who = (e.pid, e.tid)
            if e.pid in self.watchdogs or (k in _WATCHDOG_KINDS and _watchdogs_own(e)):
                # the watchdog's: file its findings under the pids they name
                named = e.args.get("pids") or [e.args.get("pid")]
                for pid in named if isinstance(named, (list, tuple)) else [named]:
                    if pid in self.procs and k not in GLYPH_KINDS:
                        self.ticks.setdefault((pid, pid), []).append(e.ts_ns)
                if k == "watchdog.stuck":
                    self.stuck.append(e)
                elif k == "watchdog.kill" and e.args.get("at_ns"):
                    self.kill_ns = min(self.kill_ns or e.args["at_ns"], e.args["at_ns"])
                elif k == "process.reaped" and e.args.get("at"):   # the line it crashed at
                    self.crash_at[e.args.get("child")] = e.args["at"]
                continue
            if who not in self.first_seen:
                self.first_seen[who] = e.ts_ns
            if e.tid != e.pid and k != "thread.start" and k != "thread.exit":
                self.busy[who] = self.busy.get(who, 0) + 1
            if k == "event.set":       # (ticked as any event; kept for _get_then_join_fix)
                self.event_sets.append(e)
            if k in special:
                self.by_kind.setdefault(k, []).append(e)
            elif k not in GLYPH_KINDS:
                self.ticks.setdefault(who, []).append(e.ts_ns)
            if e.args.get("torch"):
                self._torch_event(e)
                if k == "shm.handle" and e.args.get("token"):
                    tokens.setdefault(who, []).append(e.args["token"])
            if k in _FD_KINDS and _fd_key(e) is not None:
                fds.setdefault(_fd_key(e), {})[k] = e
            elif k == "fd.offer" and e.args.get("token") is not None:   # mpviz's, as it
                tokens.setdefault(who, []).append((e.pid, e.args["token"]))  # pickles: which message
            elif k == "fd.withdraw" and (e.pid, e.args.get("token")) in tokens.get(who, ()):
                tokens[who].remove((e.pid, e.args["token"]))   # its message failed: no message
            # what a message carried, as its sender recorded it (see the module text)
            if k in _SENDS:
                if k == "queue.feed":              # the write of a message put earlier
                    self.writes[e.args.get("msg")] = (e,)
                n = e.args.get("handles") or (counted.pop(who, 0) if k == "queue.feed" else 0)
                if n and e.args.get("msg") is not None:
                    self.handles[e.args["msg"]] = n
                for token in tokens.pop(who, ()):
                    self.fd_messages[token] = e.args.get("msg")
            elif k == "queue.handles":
                counted[who] = e.args.get("handles", 0)
            if k == "thread.start":
                self.threads[(e.pid, e.tid)] = e.args.get("name")
                for end in e.args.get("pipes") or ():       # a Pipe end among its arguments
                    self.given_threads.setdefault(end, []).append(who)
                for tq in e.args.get("queues") or ():       # a queue.Queue among them
                    self.tqueue_given.setdefault(tq, []).append(who)
            elif k == "thread.exit":
                self.thread_end[(e.pid, e.tid)] = e.ts_ns
                if e.args.get("error"):
                    self.thread_errors.append((e.pid, e.tid, e.args.get("name"),
                                               e.args["error"], e.args.get("at"), e.ts_ns,
                                               e.args.get("via")))
            elif k == "process.launch":
                self.forker[e.args.get("child")] = (e.pid, e.tid, e.ts_ns)
                for qid in e.args.get("queues") or ():
                    self.given.setdefault(qid, []).append(e.args.get("child"))
            elif k == "process.exit" and e.args.get("error"):
                self.exit_errors[e.pid] = (e.args["error"], e.args.get("at"))
            elif k in _SHM_KINDS:
                self.shm.append(e)
                if e.args.get("via") == "multiprocessing.heap" or e.args.get("torch"):
                    self.unmap_unseen.add(e.args.get("name"))
            elif k == "lock.wait":
                open_waits[(e.args["lock"], e.pid, e.tid)] = e.ts_ns
                if e.args.get("name"):
                    self.lock_names.setdefault(e.args["lock"], e.args["name"])
            elif k in ("lock.acquire", "lock.timeout"):
                since = open_waits.pop((e.args["lock"], e.pid, e.tid), None)
                if since is not None:
                    self.waits.append((e.args["lock"], e.pid, e.tid, since, e.ts_ns))
            elif k == "watchdog.stuck":
                self.stuck.append(e)
            elif k == "wait.begin":
                open_blocks.setdefault(who, []).append(e)
            elif k == "wait.end":
                begins = open_blocks.get(who)
                if begins:
                    begin = begins.pop()
                    self.blocked.append((e.pid, e.tid, begin, e.ts_ns))
                    if e.args.get("ok") is False:      # it gave up (a timeout ran out)
                        self.gave_up.add(id(begin))
            elif k == "queue.get" or k == "queue.put" or k == "pipe.send":
                on = e.args.get("pipe" if k == "pipe.send" else "queue")
                if (k == "queue.get", on, who) not in firsts:    # its first per thread
                    firsts.add((k == "queue.get", on, who))
                    (self.getters if k == "queue.get" else self.putters).setdefault(
                        on, []).append((e.pid, e.tid, e.ts_ns))
            elif k == "thread_queue.put" or k == "thread_queue.get":   # (first per thread)
                tq = e.args.get("id")
                self.tqueue_names.setdefault(tq, f"queue.Queue {len(self.tqueue_names) + 1}")
                (self.getters if k == "thread_queue.get" else self.putters).setdefault(
                    tq, []).append((e.pid, e.tid, e.ts_ns))
            elif k == "pipe.open":           # (a Listener/Client side: its own end only)
                ends = tuple(e.args.get("ends") or ())
                join_ends(self.pipes, ends)
                for end in ends[:1] if e.args.get("connect") else ends:
                    self.pipe_maker[end] = who
                if e.args.get("connect"):
                    self.connections.update(ends)
            elif k == "event.set" or k == "event.clear" or k == "condition.notify":
                on = "condition" if k == "condition.notify" else "event"
                self.signals.setdefault((on, e.args.get("id")), []).append(e)
            elif k == "pipe.recv" and not names.is_arguments(e.args.get("pipe")) and \
                    not self._managers_pipe(e.pid, e.args.get("pipe")):
                on = e.args.get("pipe")                  # who read what it sent
                if (True, on, who) not in firsts:
                    firsts.add((True, on, who))
                    self.getters.setdefault(on, []).append((e.pid, e.tid, e.ts_ns))
                # a SimpleQueue (a Pool's task queue): its get waits on the queue's id, its
                # messages are sent and read on its pipe's; who puts into one puts into both
                # (not a child's arguments, read in its _bootstrap: no get reads them; nor a
                # Manager's connection, which a forked child uses as it starts: _managers_pipe)
                recv_pipes.setdefault(who, set()).add(e.args.get("pipe"))
                if open_blocks.get(who) and open_blocks[who][-1].args.get("on") == "queue.get":
                    self.pipe_of.setdefault(open_blocks[who][-1].args.get("id"),
                                            e.args.get("pipe"))
            elif k == "pool.task":
                key = (e.pid, e.args.get("job"), e.args.get("index"))
                if e.args.get("phase") == "start":
                    open_tasks[key] = e
                elif e.args.get("phase") == "done" and key in open_tasks:
                    task = (e.pid, e.tid, open_tasks.pop(key).ts_ns, e.ts_ns)
                    self.tasks.append(task)
                    if e.args.get("ok") is False:
                        self.failed_tasks.append(task)
            elif k in ("manager.serve", "manager.use", "executor.worker"):
                self._manager_or_executor(e)
            elif k == "process.start" and e.args.get("how") == "exec":
                script = _script(e.args.get("argv"))
                if script:
                    self.scripts[e.pid] = script
        for (lid, pid, tid), since in open_waits.items():
            self.waits.append((lid, pid, tid, since, None))
        for (pid, tid), begins in open_blocks.items():
            self.blocked.extend((pid, tid, b, None) for b in begins)
        # A get that read its first message without waiting left no wait open at its read: a
        # thread that reads one pipe only, and waits in a SimpleQueue get, reads it from there.
        # A Pool worker given no task yet has read nothing (its arguments are not a pipe it
        # reads): its Pool's task queue is the one pipe its sibling workers read.
        for pid, tid, begin, _ in self.blocked:
            pipes = recv_pipes.get((pid, tid), ())
            if begin.args.get("on") == "queue.get" and len(pipes) == 1:
                self.pipe_of.setdefault(begin.args.get("id"), next(iter(pipes)))
        read_by_pools = {}             # a Pool's parent -> the pipes its workers read
        for s in self.procs.values():
            if "PoolWorker" in (s.name or ""):
                read_by_pools.setdefault(s.ppid, set()).update(recv_pipes.get((s.pid, s.pid), ()))
        for pid, tid, begin, _ in self.blocked:
            p = self.procs.get(pid)
            pipes = read_by_pools.get(p.ppid, ()) if p is not None and \
                "PoolWorker" in (p.name or "") else ()
            if begin.args.get("on") == "queue.get" and len(pipes) == 1:
                self.pipe_of.setdefault(begin.args.get("id"), next(iter(pipes)))
        self.pool_tasks = [e for e in self.by_kind.get("pool.task", ())]
        self.fd_passes = [(d["fd.send"], d["fd.recv"]) for d in fds.values() if len(d) == 2]
        # torch's requests for those fds (not messages: the hand-over says them, events.Request)
        self.fd_requests = [r for r in (Request.of(*p) for p in self.fd_passes) if r is not None]
        self.labels = _make_labels(self.procs, self.watchdogs, self.scripts)
        self.channel_names = names.channel_names(self.flows, self.threads,
                                                 self.dataloader_workers, self.pipes,
                                                 self.connections)
        self.names = names.LockNames({i: lk.type for i, lk in self.lock_infos.items()},
                                     self.lock_names, self.channel_names)
        self.waitable_names = _number_waitables(self.blocked)
        self.failures = self._failures()
        for pid, worker_id in self.dataloader_workers.items():
            self.labels[pid] = f"DataLoader worker {worker_id}"
        for e in self.by_kind.get("dist.rendezvous", ()):   # a process that joins a group
            rank = e.args.get("rank")
            if isinstance(rank, int) and rank >= 0:
                self.labels[e.pid] = f"rank {rank}"
        if hasattr(trace, "host_of"):       # several hosts' traces (trace/merge.py): "b: rank 2"
            self.labels = {pid: trace.label(pid, name) for pid, name in self.labels.items()}

    def _torch_event(self, e):
        """What real torch's events add to the index: DataLoader workers, torch segments."""
        if e.kind == "dataloader.worker":
            self.dataloader_workers[e.pid] = e.args.get("worker_id")
            if e.args.get("data_queue") is not None:
                self.dataloader_queues.setdefault(e.args["data_queue"], []).append(e.pid)
        elif e.kind in _SHM_KINDS:
            self.torch_segments.add(e.args.get("name"))
        elif e.kind in ("torch.unsupported", "torch.hook_failed"):
            self.torch_unseen.append((e.pid, e.args.get("reason")))

    def _manager_or_executor(self, e):
        """What a Manager's and an executor's events add: the Manager's server processes, who
        used which of its objects (numbered per type: "Queue 1"), the executors' workers."""
        a = e.args
        if e.kind == "manager.serve":
            self.managers[e.pid] = a.get("manager")
        elif e.kind == "executor.worker":
            self.executor_workers[e.pid] = a.get("call_queue")
        else:
            key = (a.get("manager"), a.get("id"))
            self.proxy_users.setdefault(key, []).append((e.pid, e.tid, e.ts_ns, a.get("method")))
            if key not in self.proxy_names:
                typeid = a.get("typeid") or "object"
                n = sum(name.rsplit(" ", 1)[0] == typeid for name in self.proxy_names.values())
                self.proxy_names[key] = f"{typeid} {n + 1}"

    def _managers_pipe(self, pid, pipe):
        """Is `pipe` (read by `pid`) a connection to or from a Manager's server process? Its
        messages are calls and replies, never a queue's: a forked child that has read only one
        (its proxies' incref as it starts) must not be taken for the reader of a queue there."""
        if not self.managers:
            return False
        if pid in self.managers:
            return True
        sender = str(pipe).split("-")                  # "pipe-<sender pid>-<fd>"
        return len(sender) == 3 and sender[1].isdigit() and int(sender[1]) in self.managers

    def proxy_words(self, args):
        """"the Manager's Queue 1 (kept in SyncManager-1, pid 7)": a Manager's object by the
        proxy wait's `args`, and the server process that keeps it."""
        name = self.proxy_names.get((args.get("manager"), args.get("id")),
                                    args.get("typeid") or "object")
        server = next((pid for pid, address in self.managers.items()
                       if address == args.get("manager")), None)
        kept = f" (kept in {self.labels.get(server, server)}, pid {server})" \
            if server is not None else ""
        return f"the Manager's {name}{kept}"

    def lock_name(self, lid):
        """"lock 'forks'", "Queue 1's lock", "Lock 2" (mpviz/trace/names.py)."""
        return self.names.name(lid)

    def _failures(self):
        out = []
        for e in self.by_kind.get("mark", ()):
            if e.args.get("failed"):
                out.append(Failure(e.ts_ns, e.pid, e.tid, str(e.args.get("name"))))
        for k, verb in (("queue.put_failed", "put"), ("queue.get_failed", "get")):
            for e in self.by_kind.get(k, ()):
                out.append(Failure(e.ts_ns, e.pid, e.tid, f"{verb} failed: {e.args.get('error')}"))
        for pid, tid, _, error, _, ts, _ in self.thread_errors:     # (its lane just ended)
            out.append(Failure(ts, pid, tid, f"thread ended: {error}"))
        # A write bigger than a pipe, never read, in a process the watchdog found stuck: the
        # writer is waiting for a reader that never comes (the "queue-join-deadlock" story).
        stuck = {e.args.get("pid") for e in self.stuck}
        for f in self.flows:
            n = f.put.args.get("nbytes") or 0
            if f.get is None and f.put.pid in stuck and n > PIPE_BYTES:
                for e in self.writes.get(f.put.args.get("msg"), (f.put,)):
                    out.append(Failure(e.ts_ns, e.pid, e.tid,
                                       f"write blocked: pipe full ({human_bytes(n)} to write, "
                                       f"a pipe holds {human_bytes(PIPE_BYTES)}; nobody reads)"))
        return sorted(out, key=lambda x: x.ts_ns)

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
                                 tuple(owners), tuple(waiting.get((lid, copy), ())),
                                 self.lock_name(lid)))
        return out

    def deadlocks(self, locks, t):
        found, edges = {}, {}
        for lk in locks:
            for pid, tid, _ in lk.waiters:
                for o in lk.owners:
                    if o.ghost:
                        found.setdefault((pid, tid), Deadlock(pid, tid, (
                            f"{self.thread_name(pid, tid)} waits forever for "
                            f"{self.lock_name(lk.id)}{self._user_line(pid, t)}: {o.ghost}")))
                    else:
                        edges.setdefault((pid, tid), []).append((lk.id, (o.pid, o.tid)))
        for cycle in _cycles(edges):
            who = lambda n: f"{self.labels.get(n[0], n[0])}'s {self.thread_name(*n)}"  # noqa
            steps = [f"{who(cycle[i])} waits for {self.lock_name(cycle[i + 1])}, which "
                     f"{who(cycle[i + 2])} holds" for i in range(0, len(cycle) - 1, 2)]
            reason = ("a cycle: " + "; ".join(steps) + ". Each waits for the next: none can go "
                      "on. Fix: take the locks in one order everywhere (every process and "
                      "thread takes " + " before ".join(
                          sorted({self.lock_name(lid) for lid in cycle[1::2]},
                                 key=names.in_order)) +
                      ", say -- or sort them by a key first), or hold only one at a time")
            if len(cycle) == 3:        # one thread, one lock: it waits for what it holds
                reason = (f"{who(cycle[0])} waits for {self.lock_name(cycle[1])}, which it "
                          f"holds itself: a Lock is not re-entrant (a second acquire() before "
                          f"its release() waits for ever). Fix: release it on every path "
                          f"(`with lock:`), or use an RLock if the same thread takes it again")
            for node in cycle[::2]:
                found.setdefault(node, Deadlock(node[0], node[1], reason, tuple(cycle)))
        for e in self.stuck:
            pid = e.args.get("pid", e.pid)
            if self.idle_pool_worker(pid, t):      # waiting for work: not stuck for good
                continue
            if e.args.get("reason") in ("stalled", "stopped"):
                continue            # the watchdog's verdict: it could still move (watchdog.py)
            if self._found_at(e) <= t and (pid, pid) not in found and \
                    not any(k[0] == pid for k in found):
                jobs = [b.args.get("id") for _, _, b, until in self.blocked
                        if b.pid == pid and b.args.get("on") == "pool.result" and
                        b.ts_ns <= t and (until is None or t < until)]
                dropped = [_terminated(self, job, t, pid) for job in jobs]
                lost = [f"{self.labels.get(pid, f'pid {pid}')} waits for the result of "
                        f"{d[0]}, which will never come: {d[1]}"
                        for d in dropped if d] or \
                    [task.words() for job in jobs for task in self.lost_tasks(job, t)]
                found[(pid, pid)] = Deadlock(pid, pid, (lost[0] if lost else
                                                        "the watchdog found it stuck") +
                                             user_line(e.args.get("stacks")))
        return list(found.values())

    def _found_at(self, stuck):
        """When a ``watchdog.stuck`` event's finding holds: it is written after the kill, but
        says where the process was before it (just before the kill began, where known)."""
        return stuck.ts_ns if self.kill_ns is None else min(stuck.ts_ns, self.kill_ns - 1)

    def _user_line(self, pid, t):
        """" (at your line ...)" from the watchdog's stacks of `pid`, if it took them by `t`."""
        for e in self.stuck:
            if e.args.get("pid", e.pid) == pid and self._found_at(e) <= t:
                return user_line(e.args.get("stacks"))
        return ""

    # --- blocked threads ---

    def blocked_states(self, t):
        """The threads inside a recorded wait at `t`, each with who must act (see top)."""
        out = []
        for pid, tid, begin, until in self.blocked:
            if begin.ts_ns <= t and (until is None or t < until) and \
                    self.thread_alive(pid, tid, t):
                on, target = begin.args.get("on"), begin.args.get("id")
                must, nobody = self.must_words(begin, t)
                what, acts = self.wait_words(begin), tuple(self.must_act(begin, t))
                held = self.read_lock_holder(begin, t)
                if held is not None:        # messages wait in it: the get waits for its lock
                    what, acts, must, nobody = self._behind_read_lock(begin, t, held)
                out.append(Blocked(pid, tid, on, target, begin.ts_ns, what, acts, must,
                                   nobody))
        return out

    def wait_words_at(self, begin, t):
        """wait_words, as things stand at `t`: a get behind a dead reader's read lock is said so
        (read_lock_holder), not "nothing in it yet"."""
        held = self.read_lock_holder(begin, t)
        return self.wait_words(begin) if held is None else \
            self._behind_read_lock(begin, t, held)[0]

    def read_lock_holder(self, begin, t):
        """For a get's wait on a Queue that holds messages at `t` (put, none of them got): the
        reader that holds the queue's read lock -- another get() begun earlier that never
        ended, in a process that has ended since. Killed inside get() (``terminate()``), it
        never releases the lock: every later get() waits for ever (the multiprocessing docs'
        warning on terminate()). ``(pid, tid, its get's wait.begin, messages waiting)`` or
        None."""
        if begin.args.get("on") != "queue.get":
            return None
        qid = begin.args.get("id")
        channels = {qid, self.pipe_of.get(qid)}
        waiting = sum(1 for f in self.flows if f.channel in channels and f.put.ts_ns <= t and
                      (f.get is None or f.get.ts_ns > t))
        if not waiting:
            return None
        dead = [(other.ts_ns, pid, tid, other) for pid, tid, other, until in self.blocked
                if other is not begin and other.args.get("on") == "queue.get" and
                other.args.get("id") == qid and other.ts_ns <= begin.ts_ns and
                (until is None or until > t) and not self.alive(pid, t)]
        if not dead:
            return None
        _, pid, tid, other = min(dead, key=lambda d: d[0])   # (the first reader in took it;
        return pid, tid, other, waiting                      # those after it waited for it)

    def _behind_read_lock(self, begin, t, held):
        """(what, must_act, must, nobody) of a get that waits for a queue's read lock, which a
        reader that ended holds (read_lock_holder)."""
        pid, tid, _, waiting = held
        name = self.queue_name(begin.args.get("id"))
        what = (f"get() on {name}: {waiting} message{'s' if waiting != 1 else ''} wait in it, "
                f"but this get() waits for the queue's read lock")
        must = (f"must release {name}'s read lock; it took it in its own get(): only one "
                f"reader at a time reads a Queue, and a lock held by a process that ended "
                f"({self.how_it_ended(pid)}) inside get() is never released: every get() on "
                f"{name} waits for ever. Fix: never terminate() a process that may be inside a "
                f"queue's get() or put() (the multiprocessing docs' warning on terminate()): "
                f"put a sentinel it stops at (None) and join() it")
        return what, ((pid, tid),), must, ""

    def queue_name(self, qid):
        """"Queue 2": the name the pictures give a queue (one that carried no message gets the
        next number), never its internal id."""
        if qid not in self.channel_names and self.pipe_of.get(qid) in self.channel_names:
            self.channel_names[qid] = self.channel_names[self.pipe_of[qid]]  # a SimpleQueue
        if qid not in self.channel_names and qid in self.dataloader_queues:
            self.channel_names[qid] = names.DATA_QUEUE      # (no batch in it yet)
        if qid not in self.channel_names:
            self.channel_names[qid] = names.next_queue_name(self.channel_names)
        return self.channel_names[qid]

    def wait_words(self, begin):
        """What a wait waits for, in words (a label on the timeline, a line of text)."""
        a = begin.args
        on, target = a.get("on"), a.get("id")
        exiting = " at exit" if a.get("at_exit") else ""    # in multiprocessing's exit function
        if on == "process":
            label = self.labels.get(target) or a.get("name") or f"pid {target}"
            how = "Popen.wait() for" if a.get("call") == "Popen.wait" else "join"
            return (f"{how} {label}" + (f" (pid {target})" if label != f"pid {target}" else "")
                    + exiting)
        if on == "thread":
            return f"join thread {a.get('name') or target}{exiting}"
        if on == "pipe.write":
            return f"write {human_bytes(a.get('nbytes'))} into the full pipe of {self.queue_name(target)}"
        if on == "pipe.recv":
            ends = a.get("ends") or [target]       # (connection.wait(): several ends at once)
            pipes = sorted(set(self.pipe_name(end) for end in ends), key=names.in_order)
            more = a.get("others")
            listed = pipes + ([f"{more} other object{'s' if more != 1 else ''} (a process's "
                               f"sentinel, a socket)"] if more else [])
            nothing = "nothing in it yet" if len(pipes) == 1 else "nothing in any of them yet"
            return f"{a.get('call', 'recv')}() on {names.join_and(listed)}: {nothing}"
        if on == "pipe.send":
            return f"write {human_bytes(a.get('nbytes'))} into the full {self.pipe_name(target)}"
        if on == "queue.join":
            return f"q.join() on {self.queue_name(target)}: until every item is task_done()"
        if on == "queue.get":
            return f"get() on {self.queue_name(target)}: nothing in it yet"
        if on == "thread_queue.get":
            return f"get() on {self.tqueue_name(target)}: nothing in it yet"
        if on == "thread_queue.put":
            size = a.get("maxsize")
            return (f"put() on {self.tqueue_name(target)}: it is full"
                    + (f" ({size} item{'s' if size != 1 else ''})" if size else ""))
        if on == "thread_queue.join":
            n = a.get("unfinished")
            return (f"q.join() on {self.tqueue_name(target)}: until every item is task_done()"
                    + (f" ({n} unfinished when join() began)" if n else ""))
        if on == "queue.put":
            size = a.get("maxsize")
            return (f"put() on {self.queue_name(target)}: it is full"
                    + (f" ({size} item{'s' if size != 1 else ''})" if size else ""))
        if on == "pool.result":
            return f"the result of Pool job {target}"
        if on == "future":
            if a.get("task"):
                return f"the result of {a['task']}"
            if a.get("futures") is not None:    # wait(fs) or as_completed(fs): several
                return _many_futures_words(a)
            return "a future's result" if str(target).startswith("future-") else f"{target}"
        if on == "proxy":
            what = _PROXY_MUST.get((a.get("typeid"), a.get("method")), ((), "", ""))[2]
            return f"{a.get('method')}() on {self.proxy_words(a)}" + (f": {what}" if what else "")
        if (on, target) in self.waitable_names:          # "Event 1", never its internal id
            return f"{self.waitable_names[on, target]}.{a.get('via', 'wait')}()"
        return f"{on} {target}.wait()" if on else "a wait"

    def must_act(self, begin, t):
        """(pid, tid) of the threads whose action ends this wait, as far as the trace knows."""
        on, target = begin.args.get("on"), begin.args.get("id")
        if on == "process" and target in self.procs and self.alive(target, t):
            return [(target, target)]
        if on == "thread":
            return [(begin.pid, target)] if self.thread_alive(begin.pid, target, t) else []
        if on in _THREADS_WAITS and on != "thread":
            return self._tqueue_acts(begin, t)
        if on in ("pipe.write", "queue.join", "queue.put"):  # those that got from it, ended or
            return [(p, d) for p, d, first in self.getters.get(target, ())   # not: a consumer
                    if first <= t]                     # that ended without task_done() is the story
        if on == "queue.get":                          # those that have put into it, ended or
            putters = self.putters.get(target, []) + \
                self.putters.get(self.pipe_of.get(target), [])  # not (a producer that ended
            must = [(p, d) for p, d, first in putters          # early)
                    if first <= t and (p, d) != (begin.pid, begin.tid)]
            # a DataLoader's data queue: its live workers put there, even before their first batch
            workers = [(p, p) for p in self.dataloader_queues.get(target, ()) if self.alive(p, t)]
            # a live process given the queue as an argument that has not put yet and is not in
            # a recorded wait of its own (a producer still reading its input, asleep ...)
            free, _ = self.given_not_put(target, t, begin.pid)
            return list(dict.fromkeys(must + workers + [(c, c) for c in free]))

        if on in ("pipe.recv", "pipe.send"):
            return self.other_end_acts(begin, t)
        if on == "future":
            return self._runners(begin, t)
        if on == "proxy":
            methods = _PROXY_MUST.get((begin.args.get("typeid"), begin.args.get("method")),
                                      ((),))[0]
            users = self.proxy_users.get((begin.args.get("manager"), target), ())
            return list(dict.fromkeys((p, d) for p, d, first, method in users
                                      if method in methods and first <= t and
                                      (p, d) != (begin.pid, begin.tid)))
        if on == "pool.result":
            if _terminated(self, target, t, begin.pid):
                return []     # (its Pool was terminated: no worker will ever finish it)
            return [(pid, tid) for pid, tid, a, b in self.tasks_of(target)
                    if a <= t and (b is None or t < b) and self.thread_alive(pid, tid, t)] + \
                [(lost.pid, lost.pid) for lost in self.lost_tasks(target, t)]
        return []

    def given_not_put(self, qid, t, waiter):
        """The live processes given queue `qid` as a Process argument that have not put into
        it by `t` (`waiter`'s pid left out), as (those free to put, those inside a recorded
        wait of their own: no put before it ends)."""
        put = {p for p, _, first in self.putters.get(qid, []) +
               self.putters.get(self.pipe_of.get(qid), []) if first <= t}
        waiting = {pid for pid, _, begin, until in self.blocked
                   if begin.ts_ns <= t and (until is None or until > t)}
        given = [c for c in dict.fromkeys((*self.given.get(qid, ()),
                                           *self.given.get(self.pipe_of.get(qid), ())))
                 if c != waiter and c not in put and self.alive(c, t)]
        return [c for c in given if c not in waiting], [c for c in given if c in waiting]

    def _tqueue_acts(self, begin, t):
        """Who must act for a wait on a queue.Queue (see must_act): the threads that put into
        it (got from it, for a put or a join) by `t`; for a get (a put), also the live threads
        given it as an argument that have not got from it (put into it): a producer that has
        not put yet (a consumer that has not got yet); never the waiter."""
        on, target, me = begin.args.get("on"), begin.args.get("id"), (begin.pid, begin.tid)
        used = (self.putters if on == "thread_queue.get" else self.getters).get(target, ())
        out = [(p, d) for p, d, first in used if first <= t and (p, d) != me]
        if on != "thread_queue.join":      # (a put: the given threads that have not put)
            other = (self.getters if on == "thread_queue.get" else self.putters).get(target, ())
            done = {(p, d) for p, d, _ in other}
            out += [w for w in self.tqueue_given.get(target, ()) if w not in done and
                    w not in out and w != me and self.first_seen.get(w, t) <= t and
                    self.thread_alive(*w, t)]
        return out

    def tqueue_name(self, tq):
        """"queue.Queue 1": a stdlib queue.Queue's name (numbered as the trace first met it)."""
        return self.tqueue_names.setdefault(tq, f"queue.Queue {len(self.tqueue_names) + 1}")

    def pipe_name(self, end):
        """"Pipe 2": the name of the Pipe whose end is `end` (one that carried no message yet
        gets the next number), never its id."""
        if end not in self.channel_names:
            named = [self.channel_names[e] for e in self.pipes.get(end, ())
                     if e in self.channel_names]
            self.channel_names[end] = named[0] if named else names.next_pipe_name(
                self.channel_names, "Connection" if end in self.connections else "Pipe")
            for e in self.pipes.get(end, ()):
                self.channel_names.setdefault(e, self.channel_names[end])
        return self.channel_names[end]

    def other_end(self, end):
        """The id of the other end of `end`'s Pipe (a one-way Pipe's: its write end for its
        read end, and back), or None if its ``pipe.open`` was not recorded."""
        ends = self.pipes.get(end)
        if ends is None:
            return None
        return ends[1] if ends[0] == end else ends[0]

    def other_end_acts(self, begin, t):
        """(pid, tid) of whoever must act on the other end of a Pipe for a ``pipe.recv`` wait
        (send) or a ``pipe.send`` wait (recv) to end (see Blocked): by `t`, the threads that
        used that end so (sent on it; received what this end sent), the children given it as
        a Process (or Thread) argument, else the thread that made the Pipe; not the waiting
        thread."""
        out = []
        for end in begin.args.get("ends") or [begin.args.get("id")]:   # (wait(): several)
            other = self.other_end(end)
            if begin.args.get("on") == "pipe.recv":
                used = self.putters.get(other, ())
            else:
                used = self.getters.get(end, ())
            must = [(p, d) for p, d, first in used if first <= t]
            given = [(c, c) for c in self.given.get(other, ()) if c in self.procs and
                     self.procs[c].start_ns <= t] + \
                [w for w in self.given_threads.get(other, ()) if self.first_seen.get(w, t) <= t]
            maker = self.pipe_maker.get(other)
            for w in must + (given or ([maker] if maker else [])):
                if w != (begin.pid, begin.tid) and w not in out:
                    out.append(w)
        return out

    def knots(self, blocked, in_flight, locks, t=None):
        """Threads that wait on each other for good through Pipes, futures, Pool results,
        joins (of processes and of threads), a queue.Queue's get() and join(), and locks: a
        ``Deadlock`` each. A knot is a set of blocked threads in which
        everyone who could end each one's wait is in the set too: nobody outside can help, and
        nobody inside can move. Found by striking out, until nothing changes, every thread
        whose wait someone outside the set could end (or whom nobody known can). Only waits
        that never ended (before a watchdog began to kill) count: at an instant in the middle
        of a run that went on, two ends of a ping-pong of big messages can both be inside a
        send() for a moment (the first's write is read, its wait.end not yet written). A recv
        with a message on its way is no wait for good either. A knot of locks alone is
        ``deadlocks``' to tell (a lock cycle); here one has a Pipe's, a future's or a Pool
        result's wait in it: the main thread waits for a task's result, and the worker that
        runs it waits for a lock the main thread holds.

        A multiprocessing Queue's get() is in a knot only when nothing is on its way to that
        queue and every live program thread of every process (given the queue or not: a forked
        child inherits it) is in the knot too: any other could still put."""
        coming = {f.channel for f in in_flight}
        never = {(p, d, begin.ts_ns): begin.args.get("ends") or [begin.args.get("id")]
                 for p, d, begin, until in self.blocked if until is None or
                 (self.kill_ns is not None and until >= self.kill_ns)}   # (or ended by a kill:
        # the first process killed closes its ends, and the other's recv() raises EOFError)
        timed = {(p, d, begin.ts_ns) for p, d, begin, _ in self.blocked    # (a get that times
                 if begin.args.get("timeout") is not None}   # out may then do anything: put)
        # a get() on a Manager's queue, through its proxy: as a Queue's get (any live thread
        # of the program could still put, through a proxy of its own), the Manager's server
        # process aside (its threads serve calls; they put nothing of their own)
        proxy_gets = {(p, d, begin.ts_ns) for p, d, begin, _ in self.blocked
                      if begin.args.get("on") == "proxy" and begin.args.get("method") == "get"
                      and begin.args.get("typeid") in _QUEUES}
        waits = {(b.pid, b.tid): b for b in blocked if (b.pid, b.tid, b.since_ns) in never and (
                 (b.on == "pipe.recv" and not any(   # (connection.wait(): on several ends)
                     self.other_end(end) in coming for end in never[b.pid, b.tid, b.since_ns]))
                 or b.on in ("pipe.send", "process", "future", "pool.result", "thread",
                             "thread_queue.get", "thread_queue.put", "thread_queue.join")
                 or (b.on == "queue.get" and t is not None and (b.pid, b.tid, b.since_ns)
                     not in timed and not {b.target, self.pipe_of.get(b.target)} & coming)
                 or (t is not None and (b.pid, b.tid, b.since_ns) in proxy_gets - timed))}
        for lk in locks:            # (a lock has no deadline once acquire() waits without one)
            owners = tuple((o.pid, o.tid) for o in lk.owners if not o.ghost)
            for pid, tid, since in lk.waiters:
                if owners and (pid, tid) not in waits:
                    waits[pid, tid] = Blocked(pid, tid, "lock", lk.id, since,
                                              lk.name or lk.type or "a lock", owners)
        changed = True
        while changed:
            changed = False
            for key, b in list(waits.items()):
                if not b.waits_for or any(w not in waits for w in b.waits_for) or \
                        b.on in _THREADS_WAITS and self._free_threads(key[0], waits) or \
                        (b.on == "queue.get" or (key[0], key[1], b.since_ns) in proxy_gets) \
                        and any(self._free_threads(pid, waits) for pid, p in self.procs.items()
                                if p.how not in ("launcher", "watchdog") and
                                pid not in self.managers and self.alive(pid, t) and
                                not self._idle_for_good(pid, p, waits, t)):
                    del waits[key]
                    changed = True
        if all(b.on == "lock" for b in waits.values()) or \
                all(b.on == "process" for b in waits.values()):
            return []               # (a knot of locks alone: a lock cycle, said above)
        return self._knot_told(waits)

    def _idle_for_good(self, pid, p, waits, t):
        """An idle Pool worker (waiting for its next task) whose Pool's process waits in the
        knot: it runs only what that process gives it, so it cannot put into a queue the
        knot waits on. (Counted free, it hid a cycle: main waits for a task's result, the task
        loops on a Manager Queue's get() for main to put -- sum_via_manager_queue.py.)"""
        return (p.ppid, p.ppid) in waits and self.idle_pool_worker(pid, t)

    def _free_threads(self, pid, waits):
        """The program's threads of `pid` that had not ended and are not in `waits`: a thread
        the trace saw start, which may still put into a queue.Queue or end (sleeping, or
        computing) -- then a wait on a thread of `pid` is no wait for good."""
        main = [(pid, pid)] if pid in self.procs else []     # (no thread.start of its own)
        return [key for key in main + list(self.threads) if key[0] == pid and
                key not in waits and not _LIBRARY_THREAD.search(self.threads.get(key) or "") and
                (self.thread_end.get(key) is None or
                 (self.kill_ns is not None and self.thread_end[key] >= self.kill_ns))]

    def _knot_told(self, waits):
        """The knot `waits` ({(pid, tid): Blocked}) as one Deadlock per thread, each with the
        cycle in words: its threads in the cycle's order, then those that wait behind them."""
        # told from the oldest process's oldest thread (a race decides which thread began to
        # wait first: the story is the same each time)
        waits = dict(sorted(waits.items(), key=lambda kb: (
            self.procs[kb[0][0]].start_ns if kb[0][0] in self.procs else 0,
            self.first_seen.get(kb[0], 0), kb[0])))
        who = lambda n: f"{self.labels.get(n[0], n[0])}'s {self.thread_name(*n)}"  # noqa: E731

        def step(key, b):
            others = " or ".join(who(w) for w in b.waits_for)
            if b.on == "pipe.recv":
                return f"{who(key)} waits in {b.what.split(' on ')[0]} on " \
                       f"{self.pipe_name(b.target)} for {others} to send"
            if b.on == "pipe.send":
                return f"{who(key)} waits in send() into the full {self.pipe_name(b.target)} " \
                       f"for {others} to recv"
            if b.on == "future" and "own task first;" in b.must:
                if tuple(b.waits_for) == (key,):
                    return (f"{who(key)} waits for {b.what}, which waits in the executor's "
                            f"queue for a free thread -- and the executor's only thread is "
                            f"{who(key)} itself")
                return (f"{who(key)} waits for {b.what}, which waits in the executor's queue "
                        f"until one of its threads is free: {others}")
            if b.on in ("future", "pool.result") and b.what.startswith("the result of"):
                return f"{who(key)} waits for {b.what}, which {others} runs"
            if b.on == "future":              # wait(fs), as_completed(fs): several tasks
                return f"{who(key)} waits in {b.what}, run by " + \
                    " and ".join(who(w) for w in b.waits_for)
            if b.on == "lock":
                return f"{who(key)} waits for {b.what}, which {others} holds"
            if b.on == "thread":
                return f"{who(key)} waits in join() for {others} to finish"
            if b.on in ("thread_queue.get", "queue.get", "proxy"):    # (proxy: a get here)
                return f"{who(key)} waits in {b.what.split(':')[0]} for {others} to put"
            if b.on == "thread_queue.put":
                return f"{who(key)} waits in {b.what.split(':')[0]} (full) for {others} to get"
            if b.on == "thread_queue.join":
                return f"{who(key)} waits in {b.what.split(':')[0]} for {others} to call " \
                       f"task_done()"
            call = "Popen.wait()" if b.what.startswith("Popen.wait()") else "join()"
            return f"{who(key)} waits in {call} for {self.labels.get(b.target, b.target)} to exit"
        ring = _ring(waits)
        # the cycle's threads in its order; the knot's others (each waits for one of them) after
        in_ring = list(dict.fromkeys(ring[::2]))
        if all(waits[key].on == "lock" for key in in_ring):
            return []                # (a cycle of locks, a join behind it: the lock cycle's)
        behind = [step(key, b) for key, b in waits.items() if key not in in_ring]
        reason = ("a cycle: " + "; ".join(step(key, waits[key]) for key in in_ring) +
                  (". Each waits for the next: none can go on" if len(in_ring) > 1 else
                   ": it waits for itself, and can never go on") +
                  (f" -- and behind {'them' if len(in_ring) > 1 else 'it'}, "
                   f"{'; '.join(behind)}" if behind else ""))
        joins = [b for b in waits.values() if b.on == "process"]
        results = [b for b in waits.values() if b.on in ("pool.result", "future")]
        held = [b for b in waits.values() if b.on == "lock" and
                any(w in waits and waits[w].on in ("process", "pool.result", "future")
                    for w in b.waits_for)]
        if held:
            names_ = sorted({self.lock_name(b.target) for b in held}, key=names.in_order)
            wait = "join()" if not results else "wait for the result" if not joins else \
                "join() or the wait for a result"
            reason += (f". A thread waited for others while holding {names.join_and(names_)}, "
                       f"which they must take before they can end. Fix: release it before the "
                       f"{wait} -- hold a lock only around the lines it guards")
        if (joins or results) and any(b.on in ("queue.get", "proxy") for b in waits.values()):
            reason += ". " + self._get_then_join_fix(joins, results)
        channels = {self.pipe_name(b.target) for b in waits.values() if b.on == "pipe.recv"}
        if len(waits) == 2 and len(channels) == 1 and \
                all(b.on == "pipe.recv" for b in waits.values()):
            reason += (f". Both ends of {channels.pop()} wait to receive, and neither sent "
                       f"first. Fix: agree on who speaks first -- one side sends (its request, "
                       f"a greeting) before its first recv()")
        return [Deadlock(k[0], k[1], reason, ring) for k in waits]

    def _get_then_join_fix(self, joins, results=()):
        """The fix for a process joined (or a task whose result is waited for) while it waits
        in a Queue's get(): said for a stop Event only where the joiner set one before its
        join (a stop flag the worker checks between items), else for the sentinel it was not
        sent."""
        before = "before join()" if not results else \
            "before waiting for the result" if not joins else \
            "before join() or waiting for a result"
        loops = "A process" if not results else "A task"
        told = any(e.pid == b.pid and e.ts_ns <= b.since_ns
                   for e in self.event_sets for b in list(joins) + list(results))
        if told:
            return (f"{loops} that loops on `q.get()` never ends by itself, and a stop Event it "
                    f"checks between items is never seen while it waits inside get(). Fix: "
                    f"{before}, put one sentinel per worker (`q.put(None)`) and return from "
                    f"the loop when it gets one; or get(timeout=...) and check the Event each "
                    f"time round")
        return (f"{loops} that loops on `q.get()` ends only when it gets what it stops at, and "
                f"nothing more will be put. Fix: {before}, put one sentinel per worker "
                f"(`q.put(None)`, what `iter(q.get, None)` stops at) and return from the loop "
                f"when it gets one")

    def _runners(self, begin, t):
        """Who runs the task a future's wait waits for, at `t`: the ThreadPoolExecutor's
        thread that ran it when the wait began (a task runs in one thread to its end), or the
        ProcessPoolExecutor worker that took its work item and has not sent its result. A wait
        on several futures (``futures``): whoever runs any of them."""
        out = []
        for a in begin.args.get("futures") or [begin.args]:
            if a.get("queued"):       # no thread runs it yet: the executor's threads, all busy
                out += [w for w in ((begin.pid, tid) for tid in a.get("workers") or ())
                        if w not in out and self.thread_alive(*w, t)]
                continue
            runner = a.get("runner")
            if runner is not None:
                found = [(begin.pid, runner)] if self.thread_alive(begin.pid, runner, t) else []
            else:
                found = [(pid, tid) for pid, tid, start, done in
                         self._executor_tasks(a.get("job"))
                         if start <= t and (done is None or t < done) and
                         self.thread_alive(pid, tid, t)]
            out += [w for w in found if w not in out]
        return out

    def _executor_tasks(self, job):
        """(pid, tid, start, done or None) of the executor work item `job`."""
        if job is None:
            return []
        out = []
        for e in self.by_kind.get("executor.task", ()):
            if e.args.get("job") != job:
                continue
            if e.args.get("phase") == "start":
                out.append((e.pid, e.tid, e.ts_ns, None))
            elif out and out[-1][0] == e.pid and out[-1][3] is None:
                out[-1] = out[-1][:3] + (e.ts_ns,)
        return out

    def must_words(self, begin, t):
        """(what the threads must_act names must do, where MUST does not say it; what to say
        when it names nobody, where more is known than "not recorded")."""
        a = begin.args
        if a.get("on") == "proxy":
            must = _PROXY_MUST.get((a.get("typeid"), a.get("method")))
            if must is None:
                return "", ""
            return must[1], (f"someone must call its {must[0][0]}(), and no thread the trace "
                             f"recorded has called it yet")
        if a.get("on") == "future" and a.get("futures") is not None:
            return self._many_futures_must(a, t)
        if a.get("on") == "future" and a.get("queued"):
            n = len(a.get("workers") or ())
            return (f"must finish {'its' if n == 1 else 'their'} own task first; "
                    f"{a.get('task') or 'it'} waits in the executor's queue for a free thread "
                    f"(the ThreadPoolExecutor has {n})"), ""
        if a.get("on") == "pool.result":
            tasks = [task for task in self.tasks_of(a.get("id")) if task[2] <= t]
            if tasks and all(done is not None and done <= t for *_, done in tasks):
                me = str(self.thread_name(begin.pid, begin.tid)).endswith("(_handle_results)")
                return "", ("its worker has finished it: the Pool's result handler thread must "
                            "deliver its result" + (" -- and that is this very thread, which "
                                                    "waits here instead" if me else ""))
        if a.get("on") == "future" and a.get("job") is not None:
            tasks = [task for task in self._executor_tasks(a["job"]) if task[2] <= t]
            queue = str(a["job"]).rsplit("/", 1)[0]
            if not tasks and queue in self.executor_workers.values():  # (its workers record)
                return "", ("no worker has taken it yet: it waits in the executor's queue for "
                            "a free worker")
            if not tasks:
                return "", ""
            if all(done is not None and done <= t for _, _, _, done in tasks):
                return "", ("its worker has sent its result back: the executor's own thread "
                            "must deliver it")
            pid = tasks[-1][0]
            return "", (f"{self.labels.get(pid, pid)} took it and ended before it sent its "
                        f"result back ({self.how_it_ended(pid)})")
        return "", ""

    def _many_futures_must(self, a, t):
        """must_words for a wait on several futures: who runs them must finish one (all, for
        wait(fs) of ALL_COMPLETED); the tasks no worker has taken yet are said too."""
        every = a.get("id") != "as_completed" and a.get("how", "ALL_COMPLETED") == \
            "ALL_COMPLETED"
        queued = [f.get("task") or "a task" for f in a["futures"] if f.get("job") is not None
                  and not any(task[2] <= t for task in self._executor_tasks(f["job"]))]
        must = ("run them and must finish every one" if every else
                "run them, and one must finish")
        waiting = (f"; {', '.join(queued)} {'waits' if len(queued) == 1 else 'wait'} in the "
                   f"executor's queue: no worker has taken "
                   f"{'it' if len(queued) == 1 else 'them'} yet") if queued else ""
        nobody = ("no worker has taken any of them yet: they wait in the executor's queue for "
                  "a free worker") if queued and len(queued) == len(a["futures"]) else ""
        return must + waiting, nobody

    def gone_without_putting(self, qid, t, waiter):
        """The children given queue `qid` as an argument that ended by `t` without putting
        into it: [(label, how it ended: "exit 1, after FileNotFoundError: ...")]."""
        put = {p for p, _, first in self.putters.get(qid, []) +
               self.putters.get(self.pipe_of.get(qid), []) if first <= t}
        out = []
        for pid in self.given.get(qid, ()):
            p = self.procs.get(pid)
            if pid == waiter or pid in put or p is None or self.alive(pid, t):
                continue
            out.append((self.labels.get(pid, f"pid {pid}"), self.how_it_ended(pid)))
        return out

    def how_it_ended(self, pid):
        """"exit 1, after FileNotFoundError: ... raised at load (prog.py:7): `...`", "killed
        by SIGKILL": how process `pid` ended, as far as the trace knows."""
        p = self.procs.get(pid)
        if p is None or (p.signal is None and p.exitcode is None):
            return "its exit status unknown"
        if p.signal:
            at = self.crash_at.get(pid)
            return _signal_words(p.signal) + (f" at {at}" if at else "")
        error, at = self.exit_errors.get(pid, (None, None))
        return f"exit {p.exitcode}" + (f", after {error}" if error else "") + \
            (f", raised at {at}" if error and at else "")

    def errors_before(self, t):
        """Threads of processes alive at `t` that an exception ended before `t`, and processes
        that ended with one: [(pid, tid or None, thread name, "ValueError: ...", at, via)]."""
        out = [(pid, tid, name, error, at, via) for pid, tid, name, error, at, ts, via
               in self.thread_errors if ts <= t and self.alive(pid, t)]
        for pid, (error, at) in self.exit_errors.items():
            p = self.procs.get(pid)
            if p is not None and p.exit_ns is not None and p.exit_ns <= t:
                out.append((pid, None, None, error, at, None))
        return out

    def lost_tasks(self, job, t):
        """The tasks of Pool job `job` whose result will never come: started by a worker that
        ended by `t` and sent nothing after the task began (``sys.exit``/``os._exit`` in the
        task, a crash, a kill). The Pool replaces the worker but not the task (bpo-22393)."""
        out = []
        for pid, tid, start, done in self.tasks_of(job):
            p = self.procs.get(pid)
            if start > t or p is None or self.alive(pid, t):
                continue
            if any(f.put.pid == pid and start <= f.put.ts_ns <= t for f in self.flows):
                continue                               # its result (or an error) went out
            begin = next(e for e in self.pool_tasks if e.pid == pid and e.ts_ns == start)
            out.append(LostTask(pid, self.labels.get(pid, f"pid {pid}"), p.exitcode, p.signal,
                                job, begin.args.get("index"), begin.args.get("func")))
        return out

    def pool_runs(self, pid, t):
        """Does a Pool of process `pid` run at `t` (a result handler thread of it alive)?"""
        return any(p == pid and "_handle_results" in str(name) and self.thread_alive(p, tid, t)
                   for (p, tid), name in self.threads.items())

    def idle_pool_worker(self, pid, t):
        """True if `pid` is a Pool worker that waits for its next task at `t`: no task of its
        own running, and its only open waits are a get() (the Pool's task queue) -- idle, not
        stuck: it goes on as soon as the program gives the Pool work."""
        p = self.procs.get(pid)
        if p is None or ("PoolWorker" not in (p.name or "") and
                         pid not in self.executor_workers):
            return False
        if not self.alive(pid, t):     # (killed by terminate(), its last get() still open)
            return False
        if any(e.pid == pid and e.ts_ns <= t for e in self._running_tasks(t)):
            return False
        if any(p_ == pid and start <= t and (done is None or t < done)
               for p_, _, start, done in self._executor_tasks_all()):
            return False
        waits = [b for b_pid, _, b, until in self.blocked if b_pid == pid and b.ts_ns <= t
                 and (until is None or t < until)]
        if not waits:       # (two idle workers raced for one task: the loser's get found
            # the item there, so no wait was recorded, then blocked once the winner took it)
            return any(_waits_for_work(e.args.get("stacks")) for e in self.stuck
                       if e.args.get("pid", e.pid) == pid and self._found_at(e) <= t)
        return all(b.args.get("on") == "queue.get" for b in waits)

    def _executor_tasks_all(self):
        """(pid, tid, start, done or None) of every executor work item taken."""
        jobs = dict.fromkeys(e.args.get("job") for e in self.by_kind.get("executor.task", ()))
        return [task for job in jobs for task in self._executor_tasks(job)]

    def _running_tasks(self, t):
        """The ``pool.task`` start events of tasks still running at `t` (no done by then)."""
        starts = {}
        for e in self.pool_tasks:
            if e.ts_ns > t:
                break
            key = (e.pid, e.args.get("job"), e.args.get("index"))
            if e.args.get("phase") == "start":
                starts[key] = e
            elif e.args.get("phase") == "done":
                starts.pop(key, None)
        return list(starts.values())

    def tasks_of(self, job):
        """(pid, tid, start, done or None) of Pool job `job`'s tasks."""
        starts, out = {}, []
        for e in self.pool_tasks:
            if e.args.get("job") != job:
                continue
            key = (e.pid, e.args.get("index"))
            if e.args.get("phase") == "start":
                starts[key] = e
            elif e.args.get("phase") == "done" and key in starts:
                s0 = starts.pop(key)
                out.append((e.pid, e.tid, s0.ts_ns, e.ts_ns))
        out.extend((e.pid, e.tid, e.ts_ns, None) for e in starts.values())
        return out

    # --- segments ---

    def segment_states(self, t):
        """Every segment created (or first seen) by `t`, with its status at `t`. (The cyclic
        collector off meanwhile: tens of thousands of small dicts, in no cycle, each 700 of
        which set it walking the whole trace: 0.6 s of the wait-for graph's 0.75 s of CPU
        at 20,000 segments, 0.4 s without it.) Kept per `t`: the memory map, the wait-for graph
        and plot's panel each ask it at the trace's end (an index is rebuilt when it grows)."""
        if t not in self._states_at:
            with without_gc():
                self._states_at[t] = tuple(self._segment_states(t))
        return list(self._states_at[t])

    def _segment_states(self, t):
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
                         and (s["name"] not in self.unmap_unseen or self.procs[p].signal))
            # (torch unmaps in C++, a heap arena when it is collected, both unseen: a holder of
            # one that ended by itself let go at its exit; only one killed by a signal is said
            # to have died holding it)
            named = has_name(s["strategy"], s["name"])
            if mapped:
                status = "in use" if s["unlinked_by"] is None or not named else \
                    "unlinked, still mapped"
            elif s["name"] in later_attach and s["unlinked_by"] is None:
                status = "not mapped yet"       # (one with no name: its fd on its way to it)
            elif s["unlinked_by"] is not None or not named:
                status = "freed"
            elif s["name"] in self.torch_segments:   # torch's manager unlinks it, unseen by us
                status = "unlink not seen (torch)"
            elif self._maybe_in_flight(s["ever"], t):
                status = "in flight?"
            else:
                status = "leaked"
            out.append(SegmentState(s["name"], s["strategy"], s["nbytes"], s["created_by"],
                                    mapped, tuple(s["ever"]), s["unlinked_by"], died, status))
        return out

    def _maybe_in_flight(self, holders, t):
        """A named segment nobody maps may still be on its way: a message put (by `t`) by one
        of its holders and not got by `t` may carry its handle (the trace does not say which
        memory a message names), so it is not called leaked. ``check_os`` (memory_map) asks
        the shm manager for the truth."""
        return any(f.put.pid in holders and f.put.ts_ns <= t and
                   (f.get is None or f.get.ts_ns > t) for f in self.flows)


def _make_labels(procs, watchdogs=(), scripts=None):
    """Lanes' names. ``python -m mpviz trace``'s launcher is "mpviz trace", not the program's
    "main": the program it ran is the root, named after its script (``prog.py``)."""
    labels, workers, scripts = {}, 0, scripts or {}
    helpers = set(watchdogs) | {pid for pid, p in procs.items() if p.how == "launcher"}
    roots = [p for p in procs.values() if (p.ppid not in procs or p.ppid in helpers)
             and p.pid not in helpers]
    for p in procs.values():
        name = p.name or ""
        if p.pid in watchdogs:
            labels[p.pid] = "watchdog"
        elif p.pid in helpers:
            labels[p.pid] = "mpviz trace"
        elif p.pid in scripts:
            labels[p.pid] = scripts[p.pid]
        elif p in roots:                          # the process that recorded
            labels[p.pid] = "main" if p is roots[0] else f"main {p.pid}"
        elif "PoolWorker" in name:
            labels[p.pid] = f"worker {workers}"
            workers += 1
        elif name and name != "MainProcess":
            labels[p.pid] = name
        else:
            labels[p.pid] = f"pid {p.pid}"
    return labels


def _script(argv):
    """What a traced program ran, from its ``sys.argv``: ``prog.py``, ``python -c``."""
    if not argv or not argv[0]:
        return None
    return "python -c" if argv[0] == "-c" else str(argv[0]).replace("\\", "/").rsplit("/", 1)[-1]


def _many_futures_words(a):
    """"as_completed() over 3 futures: resize('a.png'), resize('b.png') and resize('c.png')";
    futures.wait() says whether it waits for every one or the first."""
    tasks = [f.get("task") or "a task" for f in a["futures"]]
    n = a.get("pending", len(tasks))
    more = n - len(tasks)
    listed = (", ".join(tasks[:-1]) + " and " + tasks[-1] if len(tasks) > 1 and not more else
              ", ".join(tasks) + (f" and {more} more" if more else ""))
    which = "" if a.get("id") == "as_completed" else {
        "FIRST_COMPLETED": " (the first to finish)",
        "FIRST_EXCEPTION": " (all, or the first to raise)"}.get(a.get("how"), " (all of them)")
    call = "as_completed()" if a.get("id") == "as_completed" else "futures.wait()"
    return f"{call} over {n} future{'s' * (n != 1)}{which}: {listed}"


def _number_waitables(blocked):
    """{(kind, id): "Event 1"} for the Events, Conditions and Barriers waited on, numbered per
    kind in the order of their first wait (their ids are internal: a semaphore's address)."""
    names = {}
    for _, _, begin, _ in sorted(blocked, key=lambda b: b[2].ts_ns):
        key = (begin.args.get("on"), begin.args.get("id"))
        if key[0] in ("event", "condition", "barrier") and key not in names:
            n = sum(k[0] == key[0] for k in names) + 1
            names[key] = f"{key[0].capitalize()} {n}"
    return names


# waits on a thread of the waiter's own process (its join, a queue.Queue's get() and join()):
# any other live thread of that process may still act (_free_threads)
_THREADS_WAITS = ("thread", "thread_queue.get", "thread_queue.put", "thread_queue.join")
# threads of the libraries, which never put into a program's queue.Queue nor end by themselves
_LIBRARY_THREAD = re.compile(r"^QueueFeederThread$|^mpviz-|\((_handle_\w+|_serve|"
                             r"_pin_memory_loop)\)$")


def _ring(waits):
    """A cycle through the knot `waits` ({(pid, tid): Blocked}), in ``Deadlock.cycle``'s form
    (thread, what it waits on, thread, ..., the first thread again): followed from its first
    thread along the first arrow into the knot, until a thread comes round again."""
    start = next(iter(waits))
    path, node = [], start
    while node not in path[::2]:
        path += [node, waits[node].target]
        node = next(w for w in waits[node].waits_for if w in waits)
    first = path.index(node)
    return tuple(path[first:] + [node])


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


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_MPVIZ_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"   # mpviz/
_PEOPLES = ("scenarios/", "examples/")   # mpviz code that plays the user's program


_PYTHON_LIB = re.compile(r"/lib(?:64)?/python3\.\d+/")   # any Python's stdlib (and packages)


_WORK_LOOPS = {("worker", "pool.py"), ("_process_worker", "process.py")}   # a Pool's, an executor's


def _waits_for_work(stacks):
    """Does a Pool or executor worker's stack (faulthandler's text) show it in its loop's get of
    its next task -- the stdlib's get, nothing of the program's inside it?"""
    if not stacks:
        return False
    for block in re.split(r"(?=^(?:Current thread|Thread) )", str(stacks), flags=re.M):
        frames = [m.groupdict() for m in _FRAME.finditer(block)]   # (innermost first)
        loop = next((i for i, f in enumerate(frames)
                     if (f["func"], os.path.basename(f["file"])) in _WORK_LOOPS), None)
        if loop is None or loop == 0:
            continue
        inner = frames[:loop]          # (the stdlib's, and mpviz's recording hooks)
        return all(_is_machinery(f["file"]) for f in inner) and any(
            f["func"] == "get" and os.path.basename(f["file"]) == "queues.py" for f in inner)
    return False


def _is_machinery(path):
    """A frame no user wrote: the stdlib's, an installed package's, or mpviz's own (its
    scenarios and examples are programs like the user's, so they count as the user's).
    The stacks carry the paths of the machine and the mpviz copy that recorded them, which
    need not be ours (another host's trace in a merged job, another checkout's): an mpviz
    file is known by what follows a "/mpviz/" in its path, a Python's by ".../lib/python3.X/"."""
    import sysconfig
    if path.startswith("<"):                                  # <frozen runpy>, <string>
        return True
    inside = _in_mpviz(path)
    if inside is not None:
        return not inside.startswith(_PEOPLES)
    lib = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
    if path.startswith(lib) or "site-packages" in path or "dist-packages" in path:
        return True
    return bool(_PYTHON_LIB.search(path))


def _in_mpviz(path):
    """The part of `path` inside mpviz ("trace/waits.py") if it is one of mpviz's files, in
    this copy or in another (an mpviz file is known by what follows a "/mpviz/" -- any of
    them: a checkout named mpviz has two, /src/mpviz/mpviz/trace/waits.py); else None."""
    if path.startswith(_MPVIZ_DIR):
        return path[len(_MPVIZ_DIR):]
    for at in re.finditer("(?=/mpviz/)", path):
        inside = path[at.start() + len("/mpviz/"):]
        if os.path.isfile(_MPVIZ_DIR + inside):
            return inside
    return None


def user_line(stacks):
    """" (at your line file.py:12 in f(): `the code`)" -- the innermost frame of the first
    thread in a faulthandler dump (the main thread's) that is not the stdlib's nor mpviz's
    machinery; "" if it has none. A forked child's stack continues into its parent's, below
    the fork (``popen_fork.py ... _launch``): those frames are not the child's and are cut."""
    if not stacks:
        return ""
    import linecache
    text = stacks if isinstance(stacks, str) else str(stacks)
    blocks = re.split(r"(?=^(?:Current thread|Thread) )", text, flags=re.M)
    blocks.sort(key=lambda b: not b.startswith("Current thread"))  # the main thread first
    frames = []
    for block in blocks:
        frames = [m.groupdict() for m in _FRAME.finditer(block)]
        if frames:
            break
    cut = next((i for i, f in enumerate(frames) if f["file"].endswith("popen_fork.py")
                and f["func"] == "_launch"), len(frames))
    frames, inherited = frames[:cut], frames[cut:]

    def line_of(f):
        code = linecache.getline(f["file"], int(f["line"])).split("  #")[0].strip()
        return (f"{os.path.basename(f['file'])}:{f['line']} in {f['func']}()" +
                (f": `{code}`" if code else ""))

    mine = next((f for f in frames if not _is_machinery(f["file"])), None)
    if mine is not None:
        return f" (at your line {line_of(mine)})"
    if not frames:
        return ""
    shown = [f for f in frames if _in_mpviz(f["file"]) is None] or frames   # not mpviz's own
    where = " ← ".join(f"{f['func']}() ({os.path.basename(f['file'])}:{f['line']})"
                       for f in shown[:3])
    exiting = any(f["func"] == "_exit_function" for f in frames)
    parents = next((f for f in inherited if not _is_machinery(f["file"])), None)
    below = (f"; below the fork its stack still shows the parent's frames, which end in your "
             f"line {line_of(parents)}, where the parent started it" if parents else "")
    return (f" (no line of yours in its own frames: {'while exiting, ' if exiting else ''}"
            f"it was in {where}{below})")



# --- the public question ---------------------------------------------------------------------

def fd_message(trace, event):
    """The message id whose handle an ``fd.send``/``fd.recv`` `event` served (None if
    unknown): the fd is handed over later, often in another thread (torch: resource_sharer's
    _serve), so the event names the token of the handle, and the handle's message is known by
    the token."""
    return _index(trace).fd_messages.get(_fd_key(event))


def fd_requests(trace):
    """Every request for an fd that the hand-over records (torch's resource_sharer: the asker's
    thread to the sender's ``_serve``), as ``events.Request``: not messages, so not in
    ``Trace.flows()``; the timeline draws them as grey arrows all the same."""
    return list(_index(trace).fd_requests)


def open_joins(trace):
    """``{(pid, tid): child pid}``: the joins of a process (``p.join()``, ``Popen.wait()``) with no
    time limit that had not ended when the trace ends."""
    return {(pid, tid): begin.args.get("id") for pid, tid, begin, until in _index(trace).blocked
            if until is None and begin.args.get("on") == "process" and
            begin.args.get("timeout") is None}


def fd_passes(trace):
    """Every fd handed over on a Unix socket (SCM_RIGHTS) whose both ends were recorded:
    ``[(fd.send event, fd.recv event)]``, paired by the handle's token."""
    return list(_index(trace).fd_passes)


_FD_KINDS = ("fd.send", "fd.recv")


def _fd_key(e):
    """Which hand-over an fd.send/fd.recv event belongs to (None: not known). torch's token
    names its sender's socket already; mpviz's counts per sending process (fd.recv's peer)."""
    token = e.args.get("token")
    if token is None:
        return None
    if e.args.get("torch"):
        return token
    return (e.pid if e.kind == "fd.send" else e.args.get("peer"), token)


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


def lost_pool_tasks(trace, job, t_ns=None):
    """The ``LostTask``s of Pool job `job` by instant `t_ns` (None: the trace's end)."""
    ix = _index(trace)
    return ix.lost_tasks(job, ix.t1 if t_ns is None else int(t_ns))


def terminated_job(trace, job, t_ns, pid):
    """Where Pool job `job` of process `pid` was dropped unfinished by `t_ns` -- its Pool
    terminated (the end of a ``with Pool(...)`` block, terminate(), its garbage collection),
    its workers killed: ``(what, why, fix)`` in words, or None. A get() of its result waits for
    ever (squares_after_with.py: map_async in the block, get() after it)."""
    return _terminated(_index(trace), job, int(t_ns), pid)


def _terminated(ix, job, t, pid):
    end = next((e for e in ix.by_kind.get("pool.terminate", ()) if e.pid == pid and
                e.ts_ns <= t and job in (e.args.get("jobs") or ())), None)
    if end is None:
        return None
    tasks = [e for e in ix.pool_tasks if e.args.get("job") == job]
    n = (end.args.get("tasks") or {}).get(str(job))     # (in all: some may not be handed out)
    if n is None:
        n = sum(e.args.get("phase") == "submit" for e in tasks)
    done = sum(e.args.get("phase") == "done" and e.ts_ns <= end.ts_ns for e in tasks)
    func = (end.args.get("funcs") or {}).get(str(job)) or \
        next((e.args.get("func") for e in tasks if e.args.get("func")), None)
    at = f" ({end.args['at']})" if end.args.get("at") else ""
    how = end.args.get("how")
    if how == "with":
        why = (f"the Pool was terminated at the end of its `with` block{at}: a Pool's "
               f"__exit__ calls terminate(), not close() and join()")
        fix = ("get the results inside the `with` block (`.get()` before it ends), or call "
               "pool.close() and pool.join() as its last lines: they wait for the jobs")
    elif how == "terminate()":
        why = f"the program called the Pool's terminate(){at} before the job was done"
        fix = ("get the results before terminate(), or end the Pool with close() and join(), "
               "which wait for its jobs")
    elif how == "at exit":
        why = "the Pool was terminated as the interpreter exited"
        fix = "get the results before the program ends"
    else:
        why = (f"the Pool was garbage-collected{at} before the job was done -- nothing kept "
               f"a reference to it, and its finalizer terminates it")
        fix = "keep the Pool (a variable, or a `with` block) until its results are got"
    count = f"{done} of its {n} task{'s' if n != 1 else ''} done" if n else "not done"
    kills = ("drops every job not finished (a ThreadPool's threads are not killed, but what "
             "they finish is never delivered)" if end.args.get("threads") else
             "kills the workers and drops every job not finished")
    return (f"{'ThreadPool' if end.args.get('threads') else 'Pool'} job {job} "
            f"({f'{func}: ' if func else ''}{count})", f"{why}; terminate() {kills}", fix)


def unstarted_job(trace, job, t_ns):
    """If Pool job `job` was submitted by `t_ns` and no worker had started it: (its submit
    event, the ``pool.task`` starts of the tasks running then of jobs the same process
    submitted -- the busy workers that could have run it); else None."""
    ix = _index(trace)
    t = int(t_ns)
    submit = next((e for e in ix.pool_tasks if e.ts_ns <= t and e.args.get("job") == job and
                   e.args.get("phase") == "submit"), None)
    if submit is None or any(e.ts_ns <= t and e.args.get("job") == job and
                             e.args.get("phase") == "start" for e in ix.pool_tasks):
        return None
    mine = {e.args.get("job") for e in ix.pool_tasks
            if e.pid == submit.pid and e.args.get("phase") == "submit"}
    return submit, [e for e in ix._running_tasks(t) if e.args.get("job") in mine]


def gone_without_putting(trace, qid, t_ns, waiter):
    """Who was given queue `qid` (a Process argument) and ended by `t_ns` without putting into
    it: [("Process-1", "exit 1, after ...")]; `waiter`'s pid is left out."""
    return _index(trace).gone_without_putting(qid, int(t_ns), waiter)


def puts_into_their_own(trace, pid, at):
    """The other processes of the run that put into a queue.Queue (by `at`) which no thread of
    theirs gets from: meant for another process, which cannot see it -- a queue.Queue lives in
    one process's memory. (A child that uses queue.Queues between its own threads gets from
    them: not one of these.)"""
    put, got = {}, set()
    for e in trace.of_kind("thread_queue.put", "thread_queue.get", "wait.begin"):
        if e.pid == pid or e.ts_ns > at:
            continue
        if e.kind == "thread_queue.put":
            put.setdefault(e.pid, set()).add(e.args.get("id"))
        elif e.kind == "thread_queue.get" or e.args.get("on") == "thread_queue.get":
            got.add((e.pid, e.args.get("id")))
    return sorted(q for q, ids in put.items() if any((q, i) not in got for i in ids))


def given_but_waiting(trace, qid, t_ns, waiter):
    """Who was given queue `qid` (a Process argument), has not put into it by `t_ns`, and is
    alive but inside a recorded wait of its own then: ["Process-2"] (it cannot put before
    that wait ends); `waiter`'s pid is left out."""
    ix = _index(trace)
    _, waiting = ix.given_not_put(qid, int(t_ns), waiter)
    return [ix.labels.get(pid, f"pid {pid}") for pid in waiting]


def unfed_puts(trace, qid, t_ns):
    """The puts into queue `qid` by `t_ns`, of processes that ended by then, whose message
    never reached the queue's pipe (no ``queue.feed``, never got): put() hands the object to
    the feeder thread and returns; the feeder could not pickle it (``queue.put_failed`` with
    ``feeder``: its error, by message id or by process) or never ran. [(pid, error or None)],
    a process once."""
    fed = {e.args.get("msg") for e in trace.of_kind("queue.feed", "queue.get")}
    errors = {}
    for e in trace.of_kind("queue.put_failed"):
        if e.args.get("feeder") and e.ts_ns <= t_ns:
            errors.setdefault(e.args.get("msg") or e.pid, e.args.get("error"))
    ix, out = _index(trace), {}
    for e in trace.of_kind("queue.put"):
        if e.kind != "queue.put" or e.args.get("queue") != qid or e.ts_ns > t_ns or \
                e.args.get("msg") in fed or ix.alive(e.pid, t_ns):
            continue
        if e.pid not in out or out[e.pid] is None:
            out[e.pid] = errors.get(e.args.get("msg"), errors.get(e.pid))
    return list(out.items())


# The fix for a message that could not be pickled (a feeder's error, a put's).
PICKLE_FIX = ("put only what can be pickled -- the error says what could not (an open file: "
              "put its name or its contents; a lambda, a lock, a socket; a tensor that requires "
              "grad: .detach() it)")


def dropped_by_queue(trace, t_ns):
    """``{queue id: [(pid, error)]}``: the puts by `t_ns` that a feeder thread could not pickle
    and dropped. A feeder sends its queue's messages in order, so the one it failed on
    (``queue.put_failed`` with ``feeder``, by message id where known) is the first of that
    process's puts it never sent. An item dropped so is never got: a q.join() counts it
    unfinished for ever. {} at once where no feeder failed (the index keeps those events)."""
    failures = [e for e in _index(trace).by_kind.get("queue.put_failed", ())
                if e.args.get("feeder") and e.ts_ns <= t_ns]
    if not failures:
        return {}
    fed = {e.args.get("msg") for e in trace.of_kind("queue.feed", "queue.get")}
    feeds = {}                                          # (pid, tid) -> the queues it fed
    for e in trace.of_kind("queue.feed"):
        feeds.setdefault((e.pid, e.tid), set()).add(e.args.get("queue"))
    unsent = [e for e in trace.of_kind("queue.put")
              if e.args.get("msg") not in fed and e.ts_ns <= t_ns]
    out, taken = {}, set()
    for fail in failures:
        fed_by_it = feeds.get((fail.pid, fail.tid))
        put = next((e for e in unsent if e.pid == fail.pid and e.ts_ns <= fail.ts_ns and
                    e.args.get("msg") not in taken and
                    (e.args.get("msg") == fail.args.get("msg") if fail.args.get("msg") else
                     not fed_by_it or e.args.get("queue") in fed_by_it)), None)
        if put is not None:
            taken.add(put.args.get("msg"))
            error = re.sub(r" at 0x[0-9a-f]+", "", fail.args.get("error") or "")  # (a lambda's
            out.setdefault(put.args.get("queue"), []).append((put.pid, error or None))  # own)
    return out


def gone_without_signalling(trace, on, target, t_ns, waiter):
    """Who was given Event or Condition `target` (a Process argument) and ended by `t_ns`
    without setting (notifying) it: [("Process-1", "exit 1, after ...")]."""
    ix = _index(trace)
    signalled = {e.pid for e in ix.signals.get((on, target), ()) if e.ts_ns <= t_ns}
    return [(ix.labels.get(pid, f"pid {pid}"), ix.how_it_ended(pid))
            for pid in dict.fromkeys(ix.given.get(target, ()))
            if pid != waiter and pid not in signalled and pid in ix.procs and
            not ix.alive(pid, t_ns)]


def signals_before(trace, on, target, t_ns):
    """The ``event.set``/``event.clear`` (`on` "event") or ``condition.notify`` events of the
    Event or Condition `target` recorded by `t_ns`, oldest first."""
    return [e for e in _index(trace).signals.get((on, target), ()) if e.ts_ns <= t_ns]


def how_it_ended(trace, pid):
    """"exit 1, after OperationalError: ..., raised at open_db (prog.py:13): `...`", "killed
    by SIGKILL": how process `pid` ended, as far as the trace knows."""
    return _index(trace).how_it_ended(pid)


def errors_before(trace, t_ns):
    """What an exception ended before instant `t_ns`: threads of processes still alive, and
    processes (see _Index.errors_before), with how each process ended: [(pid, tid or None,
    thread name, error, at, via, how)]."""
    ix = _index(trace)
    return [(pid, tid, name, error, at, via, ix.how_it_ended(pid))
            for pid, tid, name, error, at, via in ix.errors_before(int(t_ns))]


def every_lost_pool_task(trace, t_ns=None):
    """The ``LostTask``s of every Pool job by instant `t_ns` (None: the trace's end) whose Pool
    still runs (its result handler thread is alive: a Pool ended by terminate() -- leaving a
    ``with Pool()`` block -- kills its busy workers, and waits for nothing). A program that
    waits for all the jobs at once (``pool.join()`` after ``apply_async``) waits on no one
    job's result."""
    ix = _index(trace)
    t = ix.t1 if t_ns is None else int(t_ns)
    jobs = dict.fromkeys(e.args.get("job") for e in ix.pool_tasks if e.ts_ns <= t)
    return [task for job in jobs for task in ix.lost_tasks(job, t)
            if ix.pool_runs(ix.procs[task.pid].ppid, t)]


def manager_servers(trace):
    """``{pid: address}`` of the Manager server processes of the trace (``manager.serve``):
    the Manager's own machinery, which serves the program's calls and ends none of its waits."""
    return dict(_index(trace).managers)


def executor_workers(trace):
    """The pids of the ProcessPoolExecutors' worker processes (``executor.worker``)."""
    return set(_index(trace).executor_workers)


def idle_pool_workers(trace, t_ns=None):
    """The pids of the Pool workers waiting for their next task at `t_ns` (idle, not stuck)."""
    ix = _index(trace)
    t = ix.t1 if t_ns is None else int(t_ns)
    return {pid for pid in ix.procs if ix.idle_pool_worker(pid, t)}


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
    blocked = tuple(ix.blocked_states(t))   # (first: it names the queues nobody put into yet)
    knots = ix.knots(blocked, in_flight, locks, t)   # (they say more than "the watchdog found it")
    tied = {(d.pid, d.tid) for d in knots}
    deadlocks = [d for d in ix.deadlocks(locks, t) if (d.pid, d.tid) not in tied] + knots
    return State(t, ix.t0, procs, tuple(ix.segment_states(t)), tuple(locks), in_flight,
                 tuple(deadlocks), dict(ix.labels),
                 {(p, t): ix.thread_name(p, t) for p in ix.procs for t in ix.procs[p].threads},
                 dict(ix.channel_names), blocked,
                 {p.pid: _how_it_ended(p) for p in ix.procs.values()
                  if p.start_ns <= t and not ix.alive(p.pid, t)},
                 frozenset(pid for pid in {b.pid for b in blocked if b.on == "queue.get"}
                           if ix.idle_pool_worker(pid, t)),
                 dropped_by_queue(trace, t))


def _how_it_ended(p):
    """"killed by SIGKILL", "exited, status 1", or "ended" (status 0, or how was not
    recorded)."""
    if p.signal:
        return _signal_words(p.signal)
    return "ended" if not p.exitcode else f"exited, status {p.exitcode}"


# signals that a process sends itself when its own code goes wrong: a crash, not a kill
CRASHES = {"SIGSEGV": "a bad memory access, in native code", "SIGBUS": "a bad memory access, "
            "in native code", "SIGILL": "an illegal instruction, in native code",
            "SIGFPE": "an arithmetic fault, in native code",
            "SIGABRT": "native code called abort()"}


def _signal_words(sig):
    """"killed by SIGKILL"; "crashed (SIGSEGV: a bad memory access, in native code)"."""
    return f"crashed ({sig}: {CRASHES[sig]})" if sig in CRASHES else f"killed by {sig}"


def stuck_moment(trace):
    """The instant to judge a deadlock at: just before the first still-waiting thread's process
    ended (a watchdog or a test kills stuck processes), or the trace's end; None if no thread was
    left waiting (for a lock, or in any recorded wait). Never after a watchdog began to kill:
    what the kill set off (a get() ended by EOFError as its writer died) is not the hang."""
    t = _stuck_moment(trace)
    kill = _index(trace).kill_ns
    return kill - 1 if t is not None and kill is not None and t >= kill else t


def _stuck_moment(trace):
    ix = _index(trace)
    open_waits = [(pid, since) for _, pid, _, since, until in ix.waits if until is None]
    open_waits += [(pid, b.ts_ns) for pid, _, b, until in ix.blocked if until is None]
    if not open_waits:
        return ix.t1 if ix.stuck else None
    ends = [ix.procs[pid].exit_ns for pid, _ in open_waits
            if pid in ix.procs and ix.procs[pid].exit_ns is not None]
    latest_start = max(since for _, since in open_waits)
    if ends:
        return max(latest_start, min(ends) - 1)
    return ix.t1


def busiest_moment(trace):
    """The first instant at which the most (process, segment) mappings were alive, or None if
    no segment was ever mapped: where a memory map of a clean run has the most to show."""
    ix = _index(trace)
    counts, live, best, best_t = {}, 0, 0, None
    ends = sorted((p.exit_ns, p.pid) for p in ix.procs.values() if p.exit_ns is not None)
    for e in ix.shm:
        while ends and ends[0][0] <= e.ts_ns:      # an ended process maps nothing
            _, pid = ends.pop(0)
            for key in [k for k, n in counts.items() if k[0] == pid and n > 0]:
                counts[key] = 0
                live -= 1
        key = (e.pid, e.args.get("name"))
        if e.kind in ("shm.create", "shm.attach"):
            counts[key] = counts.get(key, 0) + 1
            live += counts[key] == 1
        elif e.kind == "shm.detach" and counts.get(key, 0) > 0:
            counts[key] -= 1
            live -= counts[key] == 0
        if live > best:
            best, best_t = live, e.ts_ns
    return best_t


def busiest_wait(trace):
    """The instant at which the most threads wait (for a lock, or in a recorded wait: a join,
    q.join, a full pipe ...; the first such instant), or None when no wait was recorded: where
    a wait-for graph with no instant given has the most to show."""
    ix = _index(trace)
    spans = [(since, until) for *_, since, until in ix.waits]
    spans += [(begin.ts_ns, until) for _, _, begin, until in ix.blocked]
    changes = sorted([(since, 1) for since, _ in spans] +
                     [(until, -1) for _, until in spans if until is not None])
    best, best_t, now = 0, None, 0
    for t, step in changes:
        now += step
        if now > best:
            best, best_t = now, t
    return best_t


def deadlocks(trace):
    """The ``Deadlock``s of the whole run (judged at ``stuck_moment``), or ``[]``."""
    t = stuck_moment(trace)
    return [] if t is None else list(state_at(trace, t).deadlocks)


# --- work a run lost without a word --------------------------------------------------------------

def lost_work(trace, ended=None):
    """What a run that did not hang lost without a word, as lines for a learner: messages a
    Queue's feeder thread could not pickle and dropped, Pool and ProcessPoolExecutor tasks that
    raised where the program never saw the error (``task.error_seen``: a .get() or .result()
    that raised it, an .exception() that returned it, an error_callback), processes forked with
    torch tensors (a model) not in shared memory; and, where the program ended: messages left
    in a Queue of its own, items left in its queue.Queues, daemon children terminated mid-work. `ended`: how the run ended well ("the program ended with status 0",
    "the recorded block ended without an error"); None (it failed: its own error says why) leaves
    the task errors out. ``mpviz trace`` prints these lines at its end; ``record()`` prints them
    and keeps them as ``trace.lost_work``. (After a hang, the verdict says what a wait waits
    for.) [] when nothing was lost."""
    kinds = {e.kind for e in trace.events}        # (one pass: each below reads its kinds)
    lines = []
    if "queue.put_failed" in kinds:
        lines += _dropped_lines(trace)
    if ended and "pool.task" in kinds:
        lines += _pool_error_lines(trace, ended)
    if ended and "executor.task" in kinds:
        lines += _future_error_lines(trace, ended)
    if "process.private_args" in kinds:
        lines += _private_args_lines(trace)
    if ended and ended.startswith("the program ended"):
        lines += _unread_lines(trace)
        lines += _thread_queue_lines(trace)
        lines += _daemon_lines(trace)
    return lines


def _thread_queue_lines(trace):
    """queue.Queues of the program's own still holding items as it exited
    (``thread_queue.left``, recorded in its atexit): the threads that get from them are daemons,
    stopped with the interpreter mid-queue -- or had ended. Nothing is raised."""
    left = list(trace.of_kind("thread_queue.left"))
    if not left:
        return []
    ix = _index(trace)
    daemon = {(e.pid, e.tid): bool(e.args.get("daemon")) for e in trace.of_kind("thread.start")}
    lines = []
    for e in left:
        tq, n = e.args.get("id"), e.args.get("items") or 0
        name = ix.tqueue_name(tq)
        getters = list(dict.fromkeys((pid, tid) for pid, tid, _ in ix.getters.get(tq, ())
                                     if pid == e.pid))
        items = f"{n} item{'s' if n != 1 else ''}"
        program = ix.labels.get(e.pid, f"pid {e.pid}")
        ended_threads = {(x.pid, x.tid) for x in trace.of_kind("thread.exit")}
        daemons = [k for k, d in daemon.items() if d and k[0] == e.pid and
                   k not in ended_threads]
        if not getters and daemons:       # (not scheduled yet, on a busy machine)
            who = names.join_and([ix.thread_name(*k) for k in daemons])
            why = (f"no thread had got from it yet -- {who}, "
                   f"{'a daemon thread' if len(daemons) == 1 else 'daemon threads'}, "
                   f"stopped with the interpreter")
        elif not getters:
            why = "no thread of the program ever got from it"
        elif all(daemon.get(g) for g in getters):
            who = names.join_and([ix.thread_name(*g) for g in getters])
            why = (f"{who}, which got from it, "
                   f"{'is a daemon thread' if len(getters) == 1 else 'are daemon threads'}: "
                   f"stopped with the interpreter, mid-queue")
        else:
            who = names.join_and([ix.thread_name(*g) for g in getters])
            why = f"{who}, which got from it, had ended"
        lines.append(
            f"{name} still held {items} when {program} ended: {why} -- "
            f"{'they were' if n != 1 else 'it was'} never handled, and nothing was raised. Fix: wait "
            f"for the queue before the program ends -- `q.join()`, with a `q.task_done()` after "
            f"each `get()` -- or give the thread a sentinel to stop at (`q.put(None)`) and join "
            f"it (a thread that must finish its work is no daemon).")
    return lines


_WAITING_FOR_WORK = ("queue.get", "pipe.recv", "event", "condition", "barrier")


def _daemon_lines(trace):
    """Daemon children terminated at their parent's exit mid-work: multiprocessing's exit
    function calls terminate() (SIGTERM) on every daemon child still running, then joins them
    all -- a daemon (``process.launch`` says ``daemon``) whose join at exit (``wait.begin``
    with ``at_exit``) reaps a SIGTERM, and which never finished (no ``process.exit`` of its
    own), is one; not one idle in a get() (a server ended as daemons are meant to be). Whatever it had left to do is lost, and
    nothing is raised (a `daemon=True` writer, uploader, logger the program did not join)."""
    at_exit = {}
    for e in trace.of_kind("wait.begin"):
        if e.args.get("on") == "process" and e.args.get("at_exit"):
            at_exit[(e.pid, e.args.get("id"))] = e
    if not at_exit:
        return []
    ix = _index(trace)
    finished = {e.pid for e in trace.of_kind("process.exit")}
    begun = {e.pid: e.args.get("target") for e in trace.of_kind("process.bootstrap")}
    launched = {e.args.get("child"): e.args for e in trace.of_kind("process.launch")}
    targets = {pid: a.get("target") for pid, a in launched.items()}
    targets.update((pid, t) for pid, t in begun.items() if t)
    library = set(ix.executor_workers) | {e.pid for e in trace.of_kind("dataloader.worker")}
    lines = []
    for e in trace.of_kind("process.reaped"):
        child = e.args.get("child")
        if e.args.get("signal") != "SIGTERM" or (e.pid, child) not in at_exit or \
                child in finished or child in library or \
                not launched.get(child, {}).get("daemon"):   # (recorded at its start)
            continue
        name = ix.labels.get(child, f"pid {child}")
        p = ix.procs.get(child)
        if p is not None and any(word in (p.name or "") for word in ("PoolWorker", "Manager")):
            continue            # (a Pool's workers, a Manager's server: the library's own end)
        if any(b_pid == child and until is None and b.args.get("on") in _WAITING_FOR_WORK
               for b_pid, _, b, until in ix.blocked):
            continue            # (idle: a daemon server waiting for its next request, ended as
            #                    daemons are meant to be -- the program gave it nothing more)
        target = f" ({targets[child]})" if targets.get(child) else ""
        state = ("was still running" if child in begun else "had not begun to run its "
                 "function yet")
        lines.append(
            f"{name}{target} {state} when {ix.labels.get(e.pid, f'pid {e.pid}')} "
            f"ended, not waiting for work: it was a daemon process, and at exit "
            f"multiprocessing terminates every daemon process still running (SIGTERM) -- what "
            f"it had left to do (a file to write, a result to put) was never done, and nothing "
            f"was raised. Fix, if it had work to finish: join() it before the program ends (a "
            f"process that must finish its work is no daemon: the program then waits for it at "
            f"exit).")
    return lines


def _unread_lines(trace):
    """The messages put into a Queue of the program's own that nobody got before the program
    ended: every process is gone, so they are lost -- and nothing was raised. The classic cause
    is a loop on ``empty()``, which says True the moment the queue is empty, before the other
    processes have put the rest (``queue.empty``, recorded once per line, names it). Only
    where the program ended (``mpviz trace``): a notebook's Queue, still alive after a
    ``record()`` block, may be read in the next cell. A library's queues are left out (a Pool's,
    a DataLoader's, an executor's: they end with what their own shutdown leaves)."""
    ix = _index(trace)
    chnames = ix.channel_names
    executors = set(ix.executor_workers)
    library = lambda pid, tid: tid != pid and bool(                          # noqa: E731
        _LIBRARY_THREAD.search(ix.threads.get((pid, tid)) or "") or
        "Manager" in (ix.threads.get((pid, tid)) or ""))
    totals, unread, excluded = {}, {}, set()
    for f in ix.flows:
        ch = f.channel
        if f.put.kind != "queue.put" or not str(chnames.get(ch, "")).startswith("Queue "):
            continue
        sides = [(f.put.pid, f.put.tid)] + ([(f.get.pid, f.get.tid)] if f.get else [])
        if any(library(*side) or side[0] in executors for side in sides):
            excluded.add(ch)
        totals[ch] = totals.get(ch, 0) + 1
        if f.get is None:
            unread.setdefault(ch, []).append(f.put)
    dropped = {e.args.get("queue") for e in ix.by_kind.get("queue.put_failed", ())}
    said = {}
    for e in trace.of_kind("queue.empty"):
        said.setdefault(e.args.get("queue"), e)
    lines = []
    for ch, puts in unread.items():
        if ch in excluded or ch in dropped:       # (a dropped message: _dropped_lines)
            continue
        n, total = len(puts), totals[ch]
        pids = sorted(dict.fromkeys(e.pid for e in puts), key=lambda pid: (
            ix.procs[pid].start_ns if pid in ix.procs else 0, pid))
        who = names.join_and([ix.labels.get(pid, f"pid {pid}") for pid in pids])
        empty = said.get(ch)
        them = "them" if n != 1 else "it"
        why = (f" {ix.labels.get(empty.pid, f'pid {empty.pid}')} called empty() on "
               f"{chnames[ch]}, and it said True ({empty.args.get('at')}): empty() says only "
               f"that nothing is there at that moment -- the others may still be putting."
               if empty else "")
        lines.append(
            f"{n} of the {total} message{'s' if total != 1 else ''} put into {chnames[ch]} "
            f"(by {who}) {'were' if n != 1 else 'was'} never got: the program ended with "
            f"{them} unread, and nothing was raised.{why} Fix: if "
            f"{'they were' if n != 1 else 'it was'} meant to be got, get a known number of messages "
            f"(`for _ in range(n): q.get()`), or until each producer's sentinel (`None`) has "
            f"come -- not until empty() says True.")
    return lines


def _dropped_lines(trace):
    """The messages a Queue's feeder thread could not pickle and dropped (a lambda, an open
    file ...): put() had returned, the error went to the putting process's stderr, and the
    program went on without them -- a loss nothing in the program raised."""
    labels, names = process_labels(trace), channel_names(trace)
    end = trace.events[-1].ts_ns if trace.events else 0
    lines = []
    for qid, dropped in dropped_by_queue(trace, end).items():
        for pid in dict.fromkeys(p for p, _ in dropped):
            errors = [err for p, err in dropped if p == pid]
            n = len(errors)
            them = "them" if n > 1 else "it"
            lines.append(
                f"{labels.get(pid, f'pid {pid}')} (pid {pid}) put {n} message"
                f"{'s' if n > 1 else ''} into {names.get(qid, 'a Queue')} that never reached "
                f"it: the feeder thread could not pickle {them} "
                f"({'; '.join(dict.fromkeys(errors))}) and dropped {them} -- put() had "
                f"returned, and nothing was raised in the program. Fix: " + PICKLE_FIX)
    return lines


def _pool_error_lines(trace, ended):
    """The Pool tasks that raised, in a run that ended well: a Pool keeps a task's exception in
    its result, and only .get() raises it -- apply_async() results never asked for hide it
    ("all files parsed", and none was)."""
    seen = {e.args.get("job") for e in trace.of_kind("task.error_seen")}
    failed = sorted((e for e in trace.of_kind("pool.task")
                     if e.args.get("phase") == "done" and e.args.get("ok") is False
                     and e.args.get("job") not in seen),
                    key=lambda e: (e.args.get("job") or 0, e.args.get("index") or 0))
    if not failed:
        return []
    listed = "; ".join(f"{e.args.get('func')} (job {e.args.get('job')}) raised "
                       f"{e.args.get('error', 'an exception')}" for e in failed[:5])
    n = len(failed)
    return [f"{n} Pool task{'s' if n > 1 else ''} raised, and {ended}: "
            f"{listed}{' ...' if n > 5 else ''} -- and the program never saw "
            f"{'these errors' if n > 1 else 'this error'}: no .get() of "
            f"{'their results' if n > 1 else 'its result'} raised {'them' if n > 1 else 'it'}, "
            f"and no error_callback was given. A Pool keeps a task's exception in its result, "
            f"and only the result's .get() raises it. Fix: call .get() on every AsyncResult "
            f"apply_async() returns (or pass it error_callback=print)"]


def _future_error_lines(trace, ended):
    """The same for a ProcessPoolExecutor: a future keeps its task's exception, and only
    .result() raises it."""
    funcs = {e.args.get("job"): e.args.get("func") for e in trace.of_kind("executor.task")
             if e.args.get("phase") == "start"}
    seen = {e.args.get("job") for e in trace.of_kind("task.error_seen")}
    failed = sorted((e for e in trace.of_kind("executor.task")
                     if e.args.get("phase") == "done" and e.args.get("error")
                     and e.args.get("job") not in seen),
                    key=lambda e: int(str(e.args.get("job")).rpartition("/")[2] or 0))
    if not failed:
        return []
    n = len(failed)
    listed = "; ".join(f"{funcs.get(e.args.get('job'), 'a task')} raised {e.args['error']}"
                       for e in failed[:5])
    return [f"{n} ProcessPoolExecutor task{'s' if n > 1 else ''} raised, and {ended}: "
            f"{listed}{' ...' if n > 5 else ''} -- and the program never saw "
            f"{'these errors' if n > 1 else 'this error'}: no .result() of "
            f"{'their futures' if n > 1 else 'its future'} raised {'them' if n > 1 else 'it'}, "
            f"and no .exception() returned {'them' if n > 1 else 'it'}. A future keeps its "
            f"task's exception, and only its .result() raises it. Fix: call .result() on every "
            f"future submit() returns (or use executor.map and read what it returns)"]


def _private_args_lines(trace):
    """The processes forked with torch tensors (a model) among their arguments that were not in
    shared memory: each trains (or writes) a copy of its own, which nobody else sees -- Hogwild
    without model.share_memory(), whose parent's model never changes."""
    given = {}
    for e in trace.of_kind("process.private_args"):
        given.setdefault(tuple(e.args.get("what") or ()), []).append(e.args.get("child"))
    labels, lines = process_labels(trace), []
    for what, pids in given.items():
        who = names.join_and([f"{labels.get(pid, f'pid {pid}')} (pid {pid})" for pid in pids])
        one = len(pids) == 1
        lines.append(
            f"{who} {'was' if one else 'were'} forked with {names.join_and(list(what))} among "
            f"what {'it was' if one else 'they were'} given (arguments, or the object whose "
            f"method is the target), not in shared memory: "
            f"{'it has' if one else 'each has'} a copy of its own (fork copies memory page by "
            f"page as it is written) -- what {'it' if one else 'one'} writes into them (an "
            f"optimizer's step), the parent{'' if one else ' and the others'} never see. Fix, "
            f"if they are to be shared: model.share_memory() (a tensor's .share_memory_()) "
            f"before starting {'it' if one else 'them'}, as mnist_hogwild does")
    return lines
