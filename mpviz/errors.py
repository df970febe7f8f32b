"""The errors mpviz raises when sharing goes wrong.

Each one says *what* happened, *why* it matters under the strategy in use, and *how to fix it*,
because the person reading it is usually learning exactly that lesson. They subclass the builtin
error a torch user would have seen in the same place (``OSError`` for OS resources,
``RuntimeError`` for misuse), so existing ``except`` clauses keep working, and they pickle, so an
error raised in a child can travel to its parent.
"""


class SharingError(RuntimeError):
    """Raised when a storage cannot be moved into, or rebuilt from, shared memory."""


class ProducerExitedError(ConnectionRefusedError):
    """Raised when a receiver unpickles a ``file_descriptor`` handle whose sender has exited.

    Under ``file_descriptor`` the handle is not the memory: it is a promise by the sending process
    to hand over a file descriptor when asked. A process that has exited keeps no promises.
    """

    def __init__(self, pid, segment):
        self.pid = pid
        self.segment = segment
        super().__init__(
            111,
            f"process {pid} sent shared memory {segment} but has exited before this process "
            f"received it. Under the 'file_descriptor' strategy the receiver fetches the file "
            f"descriptor from the live sender, so the sender must stay alive until every message "
            f"it put is received. Fix: keep the producer alive (e.g. have it wait on an Event that "
            f"the consumer sets), or use mpviz.multiprocessing.set_sharing_strategy('file_system').",
        )

    def __reduce__(self):
        return (type(self), (self.pid, self.segment))


class SegmentGoneError(FileNotFoundError):
    """Raised when a ``file_system`` handle names a segment that no longer exists in /dev/shm."""

    def __init__(self, name, reason=""):
        self.name = name
        self.reason = reason
        super().__init__(
            2,
            f"shared memory segment /dev/shm{name} no longer exists, so this handle cannot be "
            f"opened. {reason or 'It was removed after the handle was made: the shm manager removes segments that no live process holds (was the sender killed?), or someone cleaned /dev/shm by hand.'} "
            f"Fix: keep a reference in a live process until the receiver has it, and never clean "
            f"/dev/shm under running jobs.",
        )

    def __reduce__(self):
        return (type(self), (self.name, self.reason))


class SharedMemoryFullError(OSError):
    """Raised when /dev/shm has no room for a new segment (ENOSPC)."""

    def __init__(self, nbytes, strategy, detail=""):
        self.nbytes = nbytes
        self.strategy = strategy
        self.detail = detail
        super().__init__(
            28,
            f"cannot allocate {nbytes:,} bytes of shared memory for the '{strategy}' strategy: "
            f"/dev/shm is full ({detail or 'No space left on device'}). Both strategies keep "
            f"shared tensors in /dev/shm, which containers make small (Docker's default is 64 MiB; "
            f"see `df -h /dev/shm`). Fix: share less at once, reuse buffers, or give the container "
            f"more (docker run --shm-size=2g, or --ipc=host).",
        )

    def __reduce__(self):
        return (type(self), (self.nbytes, self.strategy, self.detail))


class TooManyFdsError(OSError):
    """Raised when a process runs out of file descriptors under ``file_descriptor``."""

    def __init__(self, where, limit=None):
        self.where = where
        self.limit = limit
        lim = f" (the limit here is {limit})" if limit else ""
        super().__init__(
            24,
            f"too many open files while {where}{lim}. Under the 'file_descriptor' strategy every "
            f"shared storage a process holds keeps one file descriptor open. Fix: hold fewer "
            f"tensors at once (copy what you keep, or del it), raise the limit (`ulimit -n 65536`), "
            f"or call mpviz.multiprocessing.set_sharing_strategy('file_system'), which holds "
            f"segments by name and uses no descriptors.",
        )

    def __reduce__(self):
        return (type(self), (self.where, self.limit))
