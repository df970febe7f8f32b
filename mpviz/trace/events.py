"""What a trace is made of: events, and the records derived from them.

An ``Event`` is ``(ts_ns, pid, tid, kind, args)``: when (``time.monotonic_ns()``), which process and
OS thread, what happened, and a dict of JSON-able details. ``KINDS`` below is the vocabulary:
every kind the code emits, the args it may carry, and who emits it -- one table, checked against
the source by tests/test_events_table.py (a kind emitted but missing here, or listed here but
never emitted, or an arg not named in its row, fails that test).

``msg`` ids are ``"<pid>.<n>"`` strings, unique in a trace: a put and its get carry the same one,
which is how ``Trace.flows()`` links them across processes. A Queue's get learns its ``msg`` when
the trace is read: the n-th read of a pipe is its n-th write (:func:`messages.link_by_order`).
``queue``/``lock`` ids come from the semaphore under the object (its name under spawn/forkserver,
its address under fork), so every process computes the same id for the same queue or lock.
"""
from operator import itemgetter
from typing import NamedTuple, Optional


class Kind(NamedTuple):
    """One row of ``KINDS``: the args an event of this kind may carry, and who emits it."""
    args: str          # the arg names, comma-separated, each with a note in brackets if needed
    emitted_by: str


KINDS = {
    # -- processes and threads ------------------------------------------------------------
    "process.start": Kind(
        "how (record/fork/spawn/forkserver/exec, or an observer's name), ppid, name, argv",
        "the process itself, when it starts recording (recorder.start; a SideLog too)"),
    "process.launch": Kind(
        "child, name, start_method, queues (ids of the queues and Pipe ends among its "
        "arguments), target (its function's name), daemon (True for a daemon process), "
        "socket (torch_shm_manager's), torch",
        "the parent, in Process.start (hooks.py); the trace launcher (start_method 'exec'); "
        "torch_hooks.py for torch_shm_manager"),
    "process.private_args": Kind(
        "child, what (['Linear (2 tensors, 20 B)']: torch tensors and modules among its "
        "arguments not in shared memory)",
        "the parent, in Process.start under fork (hooks.py): the child has a copy of its own"),
    "process.bootstrap": Kind("name, target", "the child, entering _bootstrap (hooks.py)"),
    "process.exit": Kind(
        "exitcode, how ('atexit': a traced script), error ('FileNotFoundError: ...' that "
        "ended its run()), at (where it was raised in the program's code)",
        "the child, leaving _bootstrap (hooks.py); atexit in a traced script (autostart)"),
    "process.reaped": Kind(
        "child, exitcode, signal (e.g. 'SIGKILL'), by ('watchdog'; 'zombie': the watchdog, "
        "from /proc, of a child that ended and was not waited for; 'crash report': from "
        "faulthandler's, autostart.crash_report), at (the line it crashed at)",
        "the parent, on join/is_alive: also sees children killed before they wrote an exit; "
        "the launcher; the launcher's watchdog for what it killed"),
    "thread.start": Kind("name, ident, daemon, pipes (ids of the program's Pipe ends among "
                         "its arguments), queues (tq-PID-N: the queue.Queues among them)",
                         "the new thread (hooks.py)"),
    "thread.exit": Kind(
        "name, ident, error ('ValueError: ...' that ended its run()), at (where it was raised "
        "in the program's code), via (the library function that called that code: '_set')",
        "the ending thread (hooks.py)"),

    # -- messages: queues and pipes (messages.py, and queue_hooks.c) ---------------------
    "queue.put": Kind(
        "queue, msg, nbytes, sig (when put wrote the pipe itself), handles",
        "the putting thread (SimpleQueue, mpviz's Queue; a stdlib Queue pickles later: "
        "see queue.feed); queue_hooks.c's Hook, in C"),
    "queue.feed": Kind(
        "queue, msg, nbytes, sig, handles",
        "a stdlib Queue's feeder thread, as it writes the message (queue_hooks.c's Tap, in C; "
        "traces before 2026-11-28 had a queue.handles {handles} event just before it instead)"),
    "queue.get": Kind(
        "queue, msg (a Queue's is the matching write's, set by Trace), nbytes, sig",
        "the getter, as it reads (Queue; queue_hooks.c's Tap) or unpickles (envelopes)"),
    "thread_queue.left": Kind(
        "id (the queue.Queue's), items (still in it)",
        "the traced program's main process as it exits (autostart's atexit, waits.py): a "
        "queue.Queue of the program's own that still holds items"),
    "queue.empty": Kind(
        "queue, at (the program's line)",
        "the thread whose Queue.empty() said True, the first time at that line for that queue "
        "(waits.py): a loop on empty() stops there"),
    "queue.put_failed": Kind(
        "queue, msg (None for mpviz's Queue), error (e.g. 'Full'), feeder (True: the feeder "
        "thread could not pickle it -- queue None, msg None where queue_hooks.c pickles)",
        "the putting thread, when a recorded put raised: the message never entered"),
    "queue.get_failed": Kind(
        "queue, error",
        "mpviz's Queue.get, when the bytes it read could not be rebuilt (sender exited ...)"),
    "pipe.send": Kind("pipe ('args-<pid>': a Process's arguments), msg, nbytes, handles",
                      "the sender (Connection.send); Process.start, when the arguments it "
                      "pickled for a spawn/forkserver child carried handles (hooks.py)"),
    "pipe.recv": Kind("pipe, msg", "the receiver, as it unpickles (a child: in _bootstrap)"),
    "pipe.open": Kind("ends (the ids of its two ends: 'conn-<inode>', r/w for a one-way "
                      "Pipe; a connection's: its own end first), duplex, connect ('accept' or "
                      "'Client': a Listener/Client connection), address",
                      "the thread that made one of the program's own Pipes, or got one end of "
                      "a connection (waits.py)"),
    "executor.worker": Kind("call_queue (the id of the executor's call queue)",
                            "a ProcessPoolExecutor's worker process, as it starts (waits.py)"),
    "executor.task": Kind(
        "phase (start/done), job (the call queue's id / the work id), func (start), error "
        "(a done that raised)",
        "a ProcessPoolExecutor's worker: start as it takes a work item, done as it sends its "
        "result back (waits.py)"),
    "pool.terminate": Kind(
        "jobs (the Pool's jobs still unfinished: dropped), tasks (each job's number of "
        "tasks in all, by job as a string; null where not known yet: an imap), funcs (each "
        "job's function, the same way; null for an imap), how (with: the end of a `with "
        "Pool(...)` block; terminate(); garbage collected; at exit), at (the program's line), "
        "threads (a ThreadPool's)",
        "the process whose Pool is terminated, in Pool._terminate_pool (waits.py); only where "
        "a job was unfinished"),
    "task.error_seen": Kind(
        "job (a Pool job's number, or an executor task's 'queue id/work id'), how (get, next, "
        "result, exception: it raised or returned the task's exception; error_callback: the "
        "job has one)",
        "the program's thread that saw a task's error (waits.py): analysis.lost_work names "
        "only the errors nobody saw"),
    "manager.serve": Kind("manager (the address it listens on)",
                          "a Manager's server process, as it starts serving (waits.py)"),
    "manager.use": Kind(
        "id (the object's token id), typeid ('Queue'), method, manager (its address)",
        "a thread calling a Manager's object through a proxy: its first call of each method "
        "(waits.py)"),
    "pool.task": Kind(
        "phase (submit/start/done), job, index, chunk, func, ok (done only), error (a done "
        "that raised: 'FileNotFoundError: ...')",
        "submit: the Pool's task thread; start/done: the worker"),

    # -- shared memory and fds (mpviz.storage, sharing, reductions; torch_hooks.py) -----------
    "shm.create": Kind("name, strategy, nbytes, via (torch's; 'multiprocessing.heap'), torch",
                       "whoever makes a segment: sharing, cuda/refcount.py, torch_hooks.py, "
                       "the stdlib heap's Arena (sharedctypes: hooks.py)"),
    "shm.attach": Kind(
        "name, strategy, nbytes, kept (revived from the cache), how ('fork': inherited), "
        "via ('multiprocessing.heap': a sharedctypes arena), torch",
        "a process that maps a segment it did not make"),
    "shm.detach": Kind("name, strategy, nbytes, how (torch's unmap, unseen: 'storage freed' "
                       "or '/proc/self/maps'), torch", "a process that unmaps a segment "
                       "(torch_hooks.py: found freed, or gone from /proc/self/maps)"),
    "shm.unlink": Kind(
        "name, strategy, by (refcount / producer / shm manager)",
        "whoever removes the name: the last count (file_system), the CUDA producer's counts, "
        "a scenario that watched the shm manager do it"),
    "shm.cache": Kind(
        "hit, kept, received, name, strategy, nbytes, torch",
        "the allocator's cache: a lookup (hit), a segment kept (kept) or a received one "
        "reused (received); torch_hooks.py for torch's shared_cache"),
    "shm.handle": Kind(
        "name, strategy, nbytes, via, token, torch",
        "torch_hooks.py, in the pickling thread: the message it pickles carries a handle"),
    "copy": Kind("name, strategy, nbytes, via, torch",
                 "mpviz.storage (and torch_hooks.py): bytes copied into shm"),
    "fd.offer": Kind("name, token, nbytes",
                     "reductions.py, while pickling: an fd promised to whoever unpickles the handle"),
    "fd.send": Kind("name, token, peer, nbytes, via ('resource_sharer'), torch",
                    "the sender of an fd over SCM_RIGHTS, as it sends it (fd_passing.py's server "
                    "thread; torch_hooks.py)"),
    "fd.recv": Kind("name, token, peer, nbytes, via, torch, request_ns, request_nbytes",
                    "the receiver of an fd (reductions.py; torch_hooks.py: when it sent its "
                    "request to the sender's resource_sharer, and the request's pickled size -- "
                    "the request is not a message of the trace)"),
    "fd.withdraw": Kind("name, token",
                        "the sender, taking an offer back: its message failed to pickle, so "
                        "no receiver will ask (fd_passing.py)"),

    # -- locks and waits (locks.py, waits.py) --------------------------------------------------
    "lock.wait": Kind("lock, type, timeout, name (the waiter's variable for it, when found)",
                      "a thread that found the lock taken"),
    "lock.acquire": Kind("lock, type", "the new owner (the event's tid)"),
    "lock.timeout": Kind("lock, type", "a waiter that gave up"),
    "lock.release": Kind("lock, type", "the owner"),
    "wait.begin": Kind(
        "on (process, queue.get, queue.put, queue.join, event, condition, barrier, "
        "pool.result, future, pipe.write, thread, pipe.recv, pipe.send, proxy, "
        "thread_queue.get, thread_queue.put, thread_queue.join: a queue.Queue's), id (a pid, "
        "a queue or lock id, "
        "a Pool job, an OS thread id, a Pipe end's id, a Manager's token id, tq-PID-N: a "
        "queue.Queue), unfinished (thread_queue.join: its tasks not yet task_done()), "
        "name, nbytes, timeout, maxsize (queue.put: the full queue's size), call (Popen.wait: "
        "a subprocess's wait, not a join; recv_bytes, poll: a Pipe's recv wait that call "
        "made; wait: multiprocessing.connection.wait()), ends (its Pipe ends, when more than "
        "one), others (how many of its objects are no Pipe end: sentinels, sockets), manager, typeid, method (proxy: the Manager's "
        "address, its object's type, the method called), task ('task(3)'), job (a "
        "ProcessPoolExecutor's work item, as executor.task), runner (the OS thread id of the "
        "ThreadPoolExecutor thread running it)",
        "a thread about to block (none when the wait cannot block: a get with a message to "
        "read, a put with a free place)"),
    "thread_queue.put": Kind("id (tq-PID-N, as its waits')",
                             "a thread's first put() on a queue.Queue (the stdlib's, between "
                             "threads), called from the program's own code"),
    "thread_queue.get": Kind("id", "a thread's first get() on a queue.Queue, likewise"),
    "event.set": Kind("id (as the Event's waits')", "the thread that sets an Event"),
    "event.clear": Kind("id (as the Event's waits')", "the thread that clears an Event"),
    "condition.notify": Kind(
        "id (as the Condition's waits'), all (notify_all), waiting (how many waited then)",
        "the thread that notifies a Condition (notify_all: once)"),
    "wait.end": Kind("on, id, ok (False: timed out or raised), error",
                     "the same thread, when the wait returns; a get's wait that ends with its "
                     "read: written by the reader, at that queue.get (reader.py, _Waits)"),

    # -- CUDA (cuda/ipc.py: the backends' blocks and their IPC handles) -------------------------
    "cuda.alloc": Kind("block, nbytes, device, backend", "the producer, allocating a block"),
    "cuda.send": Kind("block, nbytes, count, device (torch's), torch",
                      "the producer, pickling a handle to a block (also torch_hooks.py)"),
    "cuda.limbo": Kind("block, nbytes, count",
                       "the producer, letting go of a block that consumers still count"),
    "cuda.free": Kind("block, nbytes, reason", "the producer, freeing a block"),
    "cuda.ipc_open": Kind("block, nbytes, producer, count, device (torch's), torch",
                          "a consumer, opening a handle (also torch_hooks.py)"),
    "cuda.ipc_close": Kind("block, producer, count", "a consumer, closing a handle"),
    "cuda.warning": Kind("message, blocks",
                         "a producer exiting while consumers still hold its blocks"),

    # -- distributed: mpviz.distributed, and real torch.distributed (dist_hooks.py) -----------
    "dist.rendezvous": Kind(
        "phase ('begin'|'end'), rank, world_size, backend, init_method, library "
        "('torch.distributed' or 'mpviz.distributed': the verdict names it), error (end, if it "
        "failed: the exception, as 'Type: message')",
        "each rank, around init_process_group: mpviz.distributed (around the store and the "
        "join); torch_hooks.py: dist_hooks.py for torch"),
    "dist.collective": Kind(
        "phase ('begin'|'end'), op (torch's name: 'all_reduce', 'broadcast', 'all_gather', "
        "'reduce_scatter', 'barrier', 'send', 'recv' ...), seq (1-based, counted by each rank: "
        "a collective's is its number among the group's collectives; a send/recv/isend/irecv's "
        "is its number among the messages from that sender to that receiver -- the n-th send "
        "from S to D meets D's n-th recv from S -- and is not counted among the group's "
        "collectives: mpviz.distributed and torch alike), group (its global ranks, "
        "sorted), rank (global), nbytes (the tensors this rank sends in), peer (send/recv "
        "only), error (end, if it failed), async_op (torch, True: ends at Work.wait())",
        "each rank, entering and leaving each outermost collective: mpviz.distributed "
        "(group.py); torch_hooks.py: dist_hooks.py for torch"),
    "dist.ring_step": Kind(
        "op, seq, step (0 .. 2W-3), chunk, send_to, recv_from (global ranks), nbytes",
        "mpviz.distributed (ring.py: a rank, after it read one chunk of its previous rank)"),
    "dist.destroy": Kind("rank", "each rank, as destroy_process_group begins (before its "
                                 "sockets close): mpviz.distributed; torch_hooks.py: "
                                 "dist_hooks.py for torch"),
    "spawn.raised": Kind("index (spawn's i: the rank, usually), error ('Type: message'), "
                         "in_backward (True: it came out of autograd's backward())",
                         "a torch.multiprocessing.spawn child whose function raised, before "
                         "spawn's _wrap exits with code 1 (torch_hooks.py: dist_hooks.py)"),

    # -- real torch (torch_hooks.py; every such event also has torch=True) ------------------------
    "torch.share_memory": Kind("module, tensors, nbytes, torch", "Module.share_memory()"),
    "dataloader.worker": Kind("phase (start/exit), worker_id, num_workers, data_queue (at "
                              "start: the queue it puts batches into), torch",
                              "a DataLoader worker"),
    "dataloader.pin_memory": Kind(
        "phase (start/exit; skipped: pin_memory=True with no accelerator), device_id, reason, "
        "torch", "DataLoader's pin-memory thread; skipped: the DataLoader's iterator"),
    "dataloader.pin": Kind("tensors, nbytes, device, torch",
                           "whoever pinned a batch (the pin-memory thread), after pinning it"),
    "torch.unsupported": Kind("version, supported, reason, torch",
                              "a torch these hooks do not know: nothing of its sharing is "
                              "recorded"),
    "torch.hook_failed": Kind("error, reason, torch",
                              "a hook raised: torch's sharing stops being recorded"),
    "not_recorded": Kind("what, why, fix, torch",
                         "a part of a framework mpviz does not see, when the program uses it "
                         "(gloo's threads, DDP's Reducer: dist_hooks.py; torch_hooks.py)"),

    # -- the recorder, observers, users ------------------------------------------------------
    "record.dropped": Kind("kind, error",
                           "the recorder, in place of an event it could not encode"),
    "watchdog.stuck": Kind("pid, name, stacks, reason, seconds",
                           "a watchdog (the launcher's, a scenario's), in a log of its own"),
    "watchdog.kill": Kind("pids, reason", "the same watchdog, after it killed them"),
    "mem.rss": Kind("of, rank, rss", "the oom_killed scenario, sampling its workers"),
    "mark": Kind("name, ... (anything else the caller gives)",
                 "mpviz.trace.mark(...), in C by writer.c's mark"),
}


def arg_names(kind):
    """The arg names of `kind`'s row, without their notes: ``["child", "exitcode", ...]``."""
    names, depth, word = [], 0, ""
    for ch in KINDS[kind].args + ",":
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            names.append(word.split()[0] if word.split() else "")
            word = ""
        elif depth == 0 and ch not in "()":
            word += ch
    return [n for n in names if n.isidentifier()]


class Event(NamedTuple):
    ts_ns: int
    pid: int
    tid: int
    kind: str
    args: dict


# How a Trace sorts its events: by time, then by process -- ``order(event)`` is
# ``(event[0], event[1])`` of an Event or a plain tuple. An ``itemgetter``, not a function: a sort
# key runs once per event, and a Python one cost the launcher 0.5 s a 290,000-event trace.
order = itemgetter(0, 1)


class Flow(NamedTuple):
    """One message from its put (or send) to its get (or recv); `get` is None while in flight."""
    put: Event
    get: Optional[Event]

    @property
    def channel(self):
        return self.put.args.get("queue") or self.put.args.get("pipe")

    @property
    def nbytes(self):
        for ev in (self.get, self.put):
            if ev is not None and ev.args.get("nbytes") is not None:
                return ev.args["nbytes"]
        return None


class Request(NamedTuple):
    """A request for an fd: the receiver's thread asks the sender's resource_sharer ``_serve``
    thread for it (torch's ``file_descriptor`` strategy). Not a message of the trace: it is read
    off the hand-over, from the fd.recv's ``request_ns`` (sent) to the fd.send (answered).
    ``put``/``get``/``nbytes`` as a Flow's, so a picture draws it as it draws a message."""
    put: Event                         # where it starts: the asker's thread, at request_ns
    get: Event                         # the fd.send: the _serve thread that answered it
    recv: Event                        # the asker's fd.recv, which says all of it

    @property
    def nbytes(self):
        return self.recv.args.get("request_nbytes")

    @property
    def channel(self):
        return None

    @classmethod
    def of(cls, sent, got):
        """The request behind a hand-over (fd.send `sent`, fd.recv `got`), or None when the
        fd.recv does not say when it was sent (an older trace: there it is a message)."""
        at = got.args.get("request_ns")
        if at is None:
            return None
        put = Event(at, got.pid, got.tid, "fd.request",
                    {"token": got.args.get("token"), "nbytes": got.args.get("request_nbytes")})
        return cls(put, sent, got)


class Segment(NamedTuple):
    """One shared-memory segment's life: who made it, who mapped it, when it went away."""
    name: str
    strategy: Optional[str]
    nbytes: Optional[int]
    created_by: Optional[int]          # pid, None if the creation was not recorded
    created_ns: Optional[int]
    attached_by: tuple                 # pids, in order of first attach
    unlinked_ns: Optional[int]
    unlinked_by: Optional[int] = None
    detached_by: tuple = ()


def has_name(strategy, name):
    """Whether a segment has a name in /dev/shm that someone must unlink (file_system, mpviz's
    own fs names, an unknown strategy); a file_descriptor segment (torch's, a memfd) has none:
    it is freed when no process maps it any more. The memory map and trace.json both ask."""
    return strategy in ("file_system", None) or str(name).startswith(("/mpviz_fs", "mpviz_fs"))


class ProcessInfo(NamedTuple):
    """One recorded process; `exitcode`/`signal` come from the child or, if killed, its parent."""
    pid: int
    ppid: Optional[int]
    name: Optional[str]
    how: Optional[str]                 # record, fork, spawn, forkserver, exec
    start_ns: int
    exit_ns: Optional[int]
    exitcode: Optional[int]
    signal: Optional[str]
    threads: tuple                     # OS thread ids seen in this process


class Hold(NamedTuple):
    """One hold of a lock: acquired at `acquire_ns` by (pid, tid), released at `release_ns`."""
    pid: int
    tid: int
    wait_ns: Optional[int]             # when it started waiting (None: it was free)
    acquire_ns: int
    release_ns: Optional[int]          # None: still held at the end of the trace


class LockInfo(NamedTuple):
    """One lock's history: its holds in time order, and waits that never got it."""
    id: str
    type: str
    holds: tuple
    waiting: tuple                     # (pid, tid, since_ns) still waiting at the end


def semlock_id(lock):
    """A name for a multiprocessing lock (or anything built on a SemLock) that every process
    computes the same way: its semaphore's name (spawn, forkserver), else its address (fork)."""
    sl = lock._semlock
    return sl.name.lstrip("/") if sl.name else f"sem-{sl.handle:x}"


def queue_id(q):
    """A queue's id in events: the id of its read lock, computed once per queue object."""
    # (getattr, not q.__dict__: reading an instance's __dict__ makes Python 3.11+ build it, and
    # from then on every attribute of that queue is read the slow way, in the stdlib's code too)
    qid = getattr(q, "_mpviz_qid", None)
    if qid is None:
        qid = q._mpviz_qid = semlock_id(q._rlock)
    return qid
