"""Names for people: what a verdict, a summary, a picture and trace.json call queues and locks.

The recorder knows a queue or a lock by an id every process can compute (events.py): the
semaphore under it (``sem-7fe2fbe4b000``: its address under fork, its name under spawn), a
Connection's ``pipe-<pid>-<fd>``, a threading lock's ``t<pid>.<n>``. Those mean nothing to a
learner, so nothing a person reads shows them. Instead::

    a Pool's queues             "the Pool's result queue"   (its _handle_results thread gets)
                                "the Pool's change notifier" (_handle_workers gets: wake-ups)
                                "the Pool's task queue"     (its _handle_tasks thread puts)
    a DataLoader's queues       "DataLoader worker 0's index queue"   (only that worker gets)
                                "the DataLoader's data queue"          (the workers put)
    a Process's arguments       "the arguments of pid 7"    (hooks.py: a pickled Process)
    any other queue, pipe       "Queue 1", "Pipe 1"         in the order of their first message
                                (a Pipe() is one name, both ends: what it sends either way)
    a Listener/Client one       "Connection 1"              (both ends, as a Pipe's)
    a lock                      "lock 'forks'"   the variable a waiter called it by, if only one
                                                 lock was called so
                                "Queue 1's lock" a queue's own lock
                                "Lock 2"         its type and its number among locks of that
                                                 type, in the order of first use

Who puts into and gets from a queue is read off the messages (``Trace.flows()``) and the
threads' names (``thread.start``): plain loops, no picture needed -- the launcher names things
in trace.json without importing matplotlib. analysis.py uses the same functions.
"""
import linecache
import os


# (which side, the Pool thread's target, the name): the first that fits names the channel
_POOL_THREADS = (("get", "_handle_results", "the Pool's result queue"),
                 ("get", "_handle_workers", "the Pool's change notifier"),
                 ("put", "_handle_tasks", "the Pool's task queue"))


def channel_names(flows, thread_names=None, dataloader_workers=None, pipes=None,
                  connections=()):
    """``{queue or pipe id: name}`` for every channel that carried a message (see the top).

    `thread_names`: ``{(pid, tid): name}`` from ``thread.start``; `dataloader_workers`:
    ``{pid: worker_id}`` from ``dataloader.worker``; `pipes`: ``{end id: its Pipe}``
    (pipe_ends: both ends of a Pipe get its one name); `connections`: the ends a Listener or
    Client made (connection_ends). Any may be None (plain numbers)."""
    thread_names, workers, pipes = thread_names or {}, dataloader_workers or {}, pipes or {}
    same_pipe = {}                               # a Pipe -> the name one of its ends got
    putters, getters = {}, {}
    for f in flows:
        putters.setdefault(f.channel, set()).add((f.put.pid, f.put.tid))
        if f.get is not None:
            getters.setdefault(f.channel, set()).add((f.get.pid, f.get.tid))
    names, counts = {}, {}
    for f in flows:
        ch = f.channel
        if ch is None or ch in names:
            continue
        if pipes.get(ch) in same_pipe:
            names[ch] = same_pipe[pipes[ch]]
            continue
        role = _role(ch, putters.get(ch, ()), getters.get(ch, ()), thread_names, workers)
        if role is None:
            kind = "Queue" if f.put.kind != "pipe.send" else \
                "Connection" if ch in connections else "Pipe"
            counts[kind] = counts.get(kind, 0) + 1
            role = f"{kind} {counts[kind]}"
        names[ch] = role
        if ch in pipes:
            same_pipe[pipes[ch]] = role
    return names


def pipe_ends(events):
    """``{end id: (its Pipe: the two end ids), ...}`` from ``pipe.open`` events (waits.py). A
    Client() that could not see its other end names its own alone: the accept() side's pair,
    before or after it, is kept (join_ends)."""
    out = {}
    for e in events:
        if e.kind == "pipe.open":
            join_ends(out, tuple(e.args.get("ends") or ()))
    return out


def join_ends(pipes, ends):
    """Record `ends` (a pipe.open's) in `pipes` ({end: its Pipe's ends}); a one-end record
    never takes the place of a pair that names that end."""
    for end in ends:
        if len(ends) >= len(pipes.get(end, ())):
            pipes[end] = ends


def connection_ends(events):
    """The end ids of the connections a ``Listener.accept()`` or a ``Client()`` made (their
    ``pipe.open`` says ``connect``)."""
    return {end for e in events if e.kind == "pipe.open" and e.args.get("connect")
            for end in e.args.get("ends") or ()}


def next_pipe_name(names, kind="Pipe"):
    """The name for a Pipe (or a Connection) that carried no message yet: the next "Pipe N"."""
    return f"{kind} {len({v for v in names.values() if v.startswith(kind + ' ')}) + 1}"


def arguments_pipe(pid):
    """The channel of the arguments a Process pickled for child `pid` (hooks.py): one message,
    read in the child's _bootstrap -- not a pipe any get() of the program reads."""
    return f"args-{pid}"


def is_arguments(channel):
    return str(channel).startswith("args-")


def _role(ch, putters, getters, thread_names, workers):
    """The part a channel plays in a library we know, or None."""
    if is_arguments(ch):                         # a Process's pickled arguments (hooks.py)
        return f"the arguments of pid {str(ch)[5:]}"
    for side, target, name in _POOL_THREADS:
        if any(target in (thread_names.get(w) or "") for w in
               (getters if side == "get" else putters)):
            return name
    if workers:
        got_by = {pid for pid, _ in getters}
        if len(got_by) == 1 and next(iter(got_by)) in workers:
            return f"DataLoader worker {workers[next(iter(got_by))]}'s index queue"
        if putters and all(pid in workers for pid, _ in putters):
            return DATA_QUEUE
    return None


DATA_QUEUE = "the DataLoader's data queue"
SEMAPHORES = ("Semaphore", "BoundedSemaphore")   # counted, not held: named so, never "lock"


def next_queue_name(names):
    """The name for a queue that carried no message yet: the next "Queue N"."""
    return f"Queue {sum(v.startswith('Queue ') for v in names.values()) + 1}"


class LockNames:
    """A reader's name for each lock (see the top): ``LockNames(...).name(lock_id)``.

    `lock_types`: ``{lock id: type or None}`` in the order of first use (``Trace.locks()``);
    `variables`: ``{lock id: the variable name a waiter used}``; `channels`: channel_names."""

    def __init__(self, lock_types, variables, channels):
        self.types, self.variables, self.channels = dict(lock_types), variables, channels
        self._said, self._for = {}, None   # names given, and the channels they were given for

    def variable(self, lid):
        """The variable name a waiter called lock `lid` by, if no other lock was waited for under
        that name: ``take_both(first, second)`` called with (a, b) in one process and (b, a) in
        another waits for both locks as ``second``, and two nodes both called 'second' would
        read as one lock."""
        name = self.variables.get(lid)
        if name is not None and list(self.variables.values()).count(name) == 1:
            return name
        return None

    def name(self, lid):
        """(Each lock's name is worked out once -- trace.json asks at every lock event, and the
        numbering walks every lock -- and again only if a channel got a name since.)"""
        if self._for != len(self.channels):
            self._said, self._for = {}, len(self.channels)
        if lid not in self._said:
            self._said[lid] = self._name(lid)
        return self._said[lid]

    def _name(self, lid):
        if self.variable(lid) is not None:
            kind = self.types.get(lid) if self.types.get(lid) in SEMAPHORES else "lock"
            return f"{kind} '{self.variable(lid)}'"
        if lid in self.channels:
            return f"{self.channels[lid]}'s lock"
        typ = self.types.get(lid) or "lock"
        same = [i for i in self.types if self.variable(i) is None and i not in self.channels
                and (self.types[i] or "lock") == typ]
        kind = "threading." if is_thread_lock(lid) else ""
        return f"{kind}{typ} {same.index(lid) + 1}" if lid in same else f"{kind}{typ}"


def is_thread_lock(lock_id):
    """True for a ``threading`` lock (private to a process; ``fork`` copies it): its id is
    ``t<pid>.<n>`` (locks.py)."""
    head, _, tail = str(lock_id).partition(".")
    return head[:1] == "t" and head[1:].isdigit() and tail.isdigit()


def for_trace(trace, flows=None):
    """(channel names, LockNames) of a whole trace, read off its events (trace.json's names).
    `flows`: ``trace.flows()`` where the caller has it already (a pass over every event)."""
    threads, workers, variables, opened = {}, {}, {}, []
    for e in trace.events:
        if e.kind == "thread.start":
            threads[(e.pid, e.tid)] = e.args.get("name")
        elif e.kind == "dataloader.worker":
            workers[e.pid] = e.args.get("worker_id")
        elif e.kind == "lock.wait" and e.args.get("name"):
            variables.setdefault(e.args["lock"], e.args["name"])
        elif e.kind == "pipe.open":
            opened.append(e)
    channels = channel_names(trace.flows() if flows is None else flows, threads, workers,
                             pipe_ends(opened), connection_ends(opened))
    locks = LockNames({lk.id: lk.type for lk in trace.locks()}, variables, channels)
    return channels, locks


def in_order(name):
    """A sort key that puts "Pipe 2" before "Pipe 10": the number in a name counted."""
    base = name.rstrip("0123456789")
    return base, int(name[len(base):] or 0)


def join_and(items):
    """"A", "A and B", "A, B and C": a list in a sentence."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def human_bytes(n):
    """``65536`` → ``'64 KiB'``, ``400000`` → ``'391 KiB'``: binary units, the ones the scenario
    texts and ``numel * 4`` arithmetic use (a 64K-element float32 tensor is 256 KiB)."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024


def line_words(fn, path, lineno):
    """"task (prog.py:21): `log.info(...)`": a line of the program's own, as a verdict says it
    (stuck.own_line, and the hooks that record one: waits.py); "task (prog.py)" where the line
    is not known."""
    if lineno is None:
        return f"{fn} ({os.path.basename(path)})"
    text = linecache.getline(path, lineno).split("  #")[0].strip()
    return f"{fn} ({os.path.basename(path)}:{lineno})" + (f": `{text}`" if text else "")
