"""The errors of CUDA IPC: what went wrong, why the rule exists, and what to do instead.

Both subclass ``RuntimeError`` (what torch raises in the same places) and pickle, so an error
raised in a child travels to its parent intact.
"""

RESEND_TEXT = ("Attempted to send CUDA tensor received from another process; this is not "
               "currently supported. Consider cloning before sending.")


class CudaResendError(RuntimeError):
    """Raised when a process puts a CUDA tensor that it received from another process.

    The block belongs to the process that allocated it, which counts who holds it; a third
    process would hold it without being counted, and could be left reading freed memory.
    """

    def __init__(self, producer_pid, block):
        self.producer_pid = producer_pid
        self.block = block
        super().__init__(
            f"{RESEND_TEXT} (mpviz: this tensor's memory, block {block}, belongs to process "
            f"{producer_pid}, which keeps it alive only while the processes it sent it to hold "
            f"it; a process you forward it to would not be counted. Fix: send a process-local "
            f"copy: x_clone = x.clone(); queue_2.put(x_clone).)")

    def __reduce__(self):
        return (type(self), (self.producer_pid, self.block))


class CudaSameProcessError(RuntimeError):
    """Raised when a process gets back, from a queue, a CUDA tensor that it put there itself.

    A CUDA IPC handle is for *other* processes: opening one's own allocation through it is an
    error in the CUDA driver, and torch "will likely end up with segfault" here.
    """

    def __init__(self, pid, block):
        self.pid = pid
        self.block = block
        super().__init__(
            f"process {pid} got back its own CUDA tensor (block {block}) from the queue it put it "
            f"on. Putting and getting a CUDA tensor on the same queue in the same process is not "
            f"supported: the handle in the queue is meant for another process (torch's docs: "
            f"\"will likely end up with segfault\"). Fix: use two queues, one for each direction "
            f"(each process gets only from the queue the *other* process puts on), or, within "
            f"one process, keep using the tensor you already have instead of sending it.")

    def __reduce__(self):
        return (type(self), (self.pid, self.block))


class CudaHandleInvalidError(RuntimeError):
    """Raised when a received CUDA handle names memory its producer has already freed."""

    def __init__(self, producer_pid, block):
        self.producer_pid = producer_pid
        self.block = block
        super().__init__(
            f"cannot open CUDA IPC handle for block {block}: process {producer_pid} has freed "
            f"that memory (it exited, or dropped the tensor after the counters said nobody held "
            f"it) before this process received it. The producer must stay alive, holding the "
            f"tensor, until every consumer has received and released it. Fix: have the producer "
            f"wait on an Event that consumers set when done (torch's best practice 2).")

    def __reduce__(self):
        return (type(self), (self.producer_pid, self.block))


class CudaForkError(RuntimeError):
    """Raised when a forked child uses CUDA that its parent had already initialised."""

    def __init__(self):
        super().__init__(
            "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
            "you must use the 'spawn' start method (mpviz: the parent used CUDA before fork(); "
            "the child's copies of its device state are not valid. Fix: "
            "mp.set_start_method('spawn') or mp.get_context('spawn'), or 'forkserver').")

    def __reduce__(self):
        return (type(self), ())
