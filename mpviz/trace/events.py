"""What a trace is made of: events, and the records derived from them.

An ``Event`` is ``(ts_ns, pid, tid, kind, args)``: when (``time.monotonic_ns()``), which process and
OS thread, what happened, and a dict of JSON-able details. The vocabulary, by who emits it:

    kind                 args                                        emitted by
    -------------------  ------------------------------------------  -------------------------------
    process.start        how (record/fork/spawn/forkserver/exec),     the process itself, when it
                         ppid, name, argv                             starts recording
    process.launch       child, name, start_method                   the parent, in Process.start
    process.bootstrap    name, target                                the child, entering _bootstrap
    process.exit         exitcode                                    the child, leaving _bootstrap
                                                                     (or atexit for a traced script)
    process.reaped       child, exitcode, signal (e.g. "SIGKILL")    the parent, on join/is_alive:
                                                                     also sees children that were
                                                                     killed and wrote no exit
    thread.start         name, ident, daemon                         the new thread
    thread.exit          name, ident                                 the ending thread
    queue.put            queue, msg, nbytes (SimpleQueue, mpviz      the putting thread
                         Queue; a stdlib Queue pickles later: see
                         queue.feed), sig (when put wrote the pipe)
    (queue.put, queue.feed and pipe.send also carry ``handles``: how many shared-memory or
     CUDA handles pickling the message made, when it made any -- what the message carried)
    queue.handles        handles                                     writer.c's feeder, just
                                                                     before that write's
                                                                     queue.feed (see messages)
    queue.put_failed     queue, msg, error (e.g. "Full")             the putting thread, when a
                                                                     recorded put raised: the
                                                                     message never entered
                                                                     (mpviz's Queue: msg None,
                                                                     no queue.put before it)
    queue.get_failed     queue, error                                mpviz's Queue.get, when the
                                                                     bytes it read could not be
                                                                     rebuilt (sender exited ...)
    queue.feed           queue, msg, nbytes, sig                     the queue's feeder thread,
                                                                     as it writes the message
    queue.get            queue, msg (Queue: nbytes, sig; msg is      the getter, as it reads (Queue)
                         the matching write's, set by Trace)          or unpickles (envelopes)
    pipe.send            pipe, msg, nbytes                           the sender (Connection.send)
    pipe.recv            pipe, msg                                   the receiver, as it unpickles
    shm.create           name, strategy, nbytes                      the core (mpviz.storage/sharing)
    shm.attach/detach    name, strategy, nbytes                      the core
    shm.unlink           name, strategy, nbytes                      the core
    copy                 nbytes, name                                the core: bytes copied into shm
    fd.send / fd.recv    name, peer                                  the core: SCM_RIGHTS transfers
    lock.wait            lock, type, timeout, name (the waiter's     a thread that found it taken
                         variable for it, when found)
    lock.acquire         lock, type                                  the new owner (event's tid)
    lock.timeout         lock, type                                  a waiter that gave up
    lock.release         lock, type                                  the owner
    wait.begin           on (process, queue.join, event, condition,   a thread about to block
                         barrier, pool.result, future, pipe.write,    (waits.py); none when the
                         thread), id (what is waited on: a pid, a     wait cannot block
                         queue or lock id, a Pool job, an OS thread
                         id), name/nbytes/timeout where known
    wait.end             on, id, ok (False: timed out or raised),     the same thread, when the
                         error                                        wait returns
    pool.task            phase (submit/start/done), job, index,      submit: the Pool's task thread;
                         chunk, func, ok (done only)                  start/done: the worker
    cuda.alloc / cuda.free, cuda.ipc_open / cuda.ipc_close           the core's CUDA backends
    watchdog.stuck       pid, stacks                                 a scenario's watchdog

Real torch's sharing (``torch_hooks.py``; every such event has ``torch=True``; names are torch's,
``/torch_<pid>_<rand>_<n>``): shm.create (``via``: reduce_storage / share_memory_ / _new_shared),
copy, shm.attach (``how="fork"``: inherited), shm.cache (``hit``), fd.send / fd.recv (``token``,
``via="resource_sharer"``), and

    shm.handle           name, strategy, nbytes, via, token          the pickling thread: the
                                                                     message it pickles carries a
                                                                     handle (its next queue.feed,
                                                                     pipe.send or queue.put)
    torch.share_memory   module, tensors, nbytes                     Module.share_memory()
    dataloader.worker    phase (start/exit), worker_id, num_workers  a DataLoader worker
    torch.unsupported    version, supported, reason                  a torch these hooks do not
                                                                     know: nothing of torch's
                                                                     sharing is recorded
    torch.hook_failed    error, reason                               a hook raised: torch's
                                                                     sharing stops being recorded
    mark                 name, anything else                         mpviz.trace.mark(...)

``msg`` ids are ``"<pid>.<n>"`` strings, unique in a trace: a put and its get carry the same one,
which is how ``Trace.flows()`` links them across processes. A Queue's get learns its ``msg`` when
the trace is read: the n-th read of a pipe is its n-th write (:func:`messages.link_by_order`).
``queue``/``lock`` ids come from the semaphore under the object (its name under spawn/forkserver,
its address under fork), so every process computes the same id for the same queue or lock.
"""
from typing import NamedTuple, Optional


class Event(NamedTuple):
    ts_ns: int
    pid: int
    tid: int
    kind: str
    args: dict


def order(event):
    """How a Trace sorts its events: by time, then by process (an Event or a plain tuple)."""
    return (event[0], event[1])


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
