"""queue-join-deadlock: a child put a large item on a Queue; the parent joins it before getting.

What happens: ``Queue.put`` of a large item does not write it: it appends the object to a
buffer, and a *feeder thread* in the putting process writes the pickled bytes into a pipe. (The
stdlib's put never writes; mpviz's writes a message itself only when it fits in the pipe right
now, which 1 MiB never does.) A pipe holds only 64 KiB; the feeder blocks until someone reads.
And a process that put items on a queue waits, as it exits, for its feeder thread to finish
writing them. So::

    child   put(1 MiB) ─▶ feeder thread: write ... pipe full (64 KiB), waits for a reader
            exit ─▶ joins its feeder thread ... waits
    parent  child.join() ... waits for the child to exit        ← nobody reads: deadlock
            q.get()          (never reached)

The stdlib documents it ("Joining processes that use queues"): "a process that has put items in
a queue will wait before terminating until all the buffered items are fed by the feeder thread
to the underlying pipe ... make sure that all items which have been put on the queue will
eventually be removed before the process is joined."

The fix: get before you join (``get_before_join=True``). Sending a tensor instead is no way
out: its small handle fits in the pipe, so the child exits and the join returns, but under the
default ``file_descriptor`` strategy the parent's ``get()`` must then fetch the tensor's file
descriptor from the child, which is gone: ``ConnectionRefusedError`` in torch,
``ProducerExitedError`` in mpviz (notebook 03). Get before you join, whatever you send.
"""
from ._common import check_between, context, get, kib, start_method_param, step
from .base import Param

SUMMARY = "child puts a large item, parent joins before get: the feeder thread can't flush"
PARAMS = {
    "get_before_join": Param(False, [False, True],
                             "get the item before joining the child (the fix) or join first"),
    "nbytes": Param(1 << 20, None, "size of the item the child puts (a pipe holds 64 KiB)"),
    "start_method": start_method_param("fork"),
}
STALL_SECONDS = 2.5


def check_params(p):
    check_between(p, "nbytes", 1, 16 << 20, " (16 MiB)")


def put_big(q, nbytes):
    step("child puts a large item", nbytes=nbytes)
    q.put(b"x" * nbytes)
    step("child's put returned; now it exits (and waits for its feeder thread)")


def drive(p, details):
    ctx = context(p)
    q = ctx.Queue()
    child = ctx.Process(target=put_big, args=(q, p["nbytes"]), name="child")
    child.start()
    details["child_pid"] = child.pid
    if p["get_before_join"]:
        step("parent gets first")
        item = get(q, what="the child's item")
        details["received_bytes"] = len(item)
        step("parent joins the child")
        child.join()
    else:
        step("parent joins the child first")
        child.join()                 # never returns when the item is larger than the pipe
        item = get(q, what="the child's item")
        details["received_bytes"] = len(item)
    details["child_exitcode"] = child.exitcode


def verdict(t, details):
    n = details["params"]["nbytes"]
    if "stuck" in details:
        return "deadlock", (
            f"The child's put of {kib(n)} returned at once, but its feeder thread could write "
            f"only what fits in the pipe (64 KiB) and then waited for a reader. The child, "
            f"exiting, waits for its feeder thread; the parent waits in join() for the child; "
            f"the get() that would empty the pipe comes after the join. The timeline shows the "
            f"put with no matching get. Fix: get everything a process put before joining it "
            f"(get_before_join=True). Sending a tensor instead is no way out: its small handle "
            f"fits in the pipe and the child exits, but then, under the default "
            f"file_descriptor strategy, get() must fetch the tensor from the exited child and "
            f"fails (ConnectionRefusedError in torch, ProducerExitedError in mpviz).")
    if details.get("received_bytes") == n and details.get("child_exitcode") == 0:
        order = ("got the item, then joined" if details["params"]["get_before_join"] else
                 "joined first, but the item fit in the pipe, so the child could exit")
        return "ok", (f"The parent {order}: the {kib(n)} item arrived and the child exited "
                      f"cleanly. Joining before getting hangs as soon as an item is bigger than "
                      f"the pipe's 64 KiB.")
    return "error", f"Unexpected end: {details}"
