"""sender-fds: under file_descriptor, the *sender* that keeps what it sent runs out of fds.

What happens: too-many-fds shows the consumer's side of pitfall #7. The sender pays too: under
``file_descriptor`` every storage a process moved into shared memory keeps one file descriptor
open in that process for as long as the storage lives. A producer that keeps the tensors it sent
-- a DataLoader worker's prefetched batches, a replay buffer, a list "for later" -- holds one fd
per tensor, and the next tensor it shares cannot be made. torch says
``unable to open shared memory object </torch_…> in read-write mode: Too many open files (24)``
-- raised by ``share_memory_()``, but printed by the feeder thread when the move happens inside
``Queue.put``, which returns normally while the tensor is dropped (as in non-leaf-put). mpviz
raises ``TooManyFdsError`` (an ``OSError`` 24) at the put that needed a new segment::

    producer (limit 48)   put(t1)   put(t2)   ...  put(t29)  ✗ EMFILE creating a shared storage
    open fds              21        22        ...  48            (it still holds t1 ... t28)
    consumer              get, ack  get, ack  ...            drops each tensor at once

The consumer acknowledges each tensor before the producer sends the next, so only one is ever in
flight: the fds are those of the tensors the producer *keeps*. (Tensors in flight count as well:
the sender keeps an fd for each handle until the receiver has fetched its own copy, so a producer
far ahead of its consumer runs out the same way.)

The fixes: keep fewer sent tensors alive in the sender (``keep=False``: drop each one once it is
sent; reuse a few buffers), raise ``ulimit -n``, or ``strategy='file_system'``, where a segment
is held by its name and keeps no fd open.
"""
import resource

from .. import zeros
from ._common import (check_between, context, get, headline, start_method_param, step,
                      strategy_param)
from .base import Param
from .too_many_fds import _nfds   # this process's open fds, the same count

SUMMARY = "the sender keeps what it sent: its own fds run out (Too many open files)"
PARAMS = {
    "strategy": strategy_param("file_descriptor", "file_system keeps no fd per segment"),
    "keep": Param(True, [True, False], "the producer keeps every tensor it sent (a list)"),
    "count": Param(100, None, "how many tensors the producer sends"),
    "limit": Param(48, None, "the producer's RLIMIT_NOFILE (its fd limit)"),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    check_between(p, "limit", 20, 1024)
    check_between(p, "count", 1, 2000)




def produce(q, acks, out, count, limit, keep):
    """Lower our own fd limit, then share and send `count` new tensors, keeping them if `keep`.

    The fd counts in the module's picture are the numbers of one run: 18 fds open at the start;
    the first put opens 2 more to hand descriptors over -- mpviz's listening socket and the
    consumer's connection to it --; then one more per kept tensor, until 18 + 2 + 28 = 48."""
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    start_fds = peak = _nfds()
    step("producer lowered its fd limit", limit=limit, open_fds=start_fds)
    sent, kept, error = 0, [], None
    try:
        for i in range(count):
            t = zeros(4)
            q.put(t)                      # moves t into shared memory: a new segment, one fd
            acks.get()                    # the consumer has it: one tensor in flight at a time
            sent += 1
            if keep:
                kept.append(t)
            del t
            if i % 10 == 9:
                peak = max(peak, _nfds() or 0)
                step("producer has sent", tensors=sent, open_fds=peak)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
        step("producer ran out of file descriptors", sent=sent)
    peak = max(peak, _nfds() or 0)
    q.put(None)                           # the end: the consumer stops here
    out.put({"sent": sent, "error": error, "start_fds": start_fds, "peak_fds": peak})
    out.get()                             # wait until the consumer has fetched everything
    del kept[:]


def consume(q, acks, out):
    """Get tensors until None, dropping each at once and acknowledging it; say how many."""
    got = 0
    while q.get() is not None:
        got += 1
        acks.put(got)
    out.put({"consumer_got": got})


def drive(p, details):
    ctx = context(p)
    q, acks, out, done = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    producer = ctx.Process(target=produce, args=(q, acks, out, p["count"], p["limit"], p["keep"]),
                           name="producer")
    consumer = ctx.Process(target=consume, args=(q, acks, done), name="consumer")
    producer.start()
    consumer.start()
    details.update(get(out, timeout=25, what="the producer's report", sender=producer))
    details.update(get(done, timeout=25, what="the consumer's count", sender=consumer))
    out.put("done")                       # the producer may drop what it kept, and exit
    consumer.join()
    producer.join()


def verdict(t, details):
    prm = details["params"]
    if details.get("error"):
        start = details["start_fds"]
        other = prm["limit"] - start - details["sent"]     # at EMFILE, open fds == the limit
        return "error", (
            f"Under '{prm['strategy']}' the producer kept every tensor it sent, and each one "
            f"kept an fd open in the producer: the {start} fds it had open at the start, "
            f"{other} more that its first put opened to hand descriptors over (mpviz's "
            f"listening socket and the consumer's connection) and {details['sent']} kept "
            f"tensors came to its limit: {start} + {other} + {details['sent']} = "
            f"{prm['limit']}. Sharing tensor #{details['sent'] + 1} failed in the producer's put: "
            f"{headline(details['error'])} The consumer dropped everything it got "
            f"({details['consumer_got']} tensors): the sender ran out on its own. torch says "
            f"'unable to open shared memory object </torch_…> in read-write mode: Too many open "
            f"files (24)', but not at the put: its Queue's feeder thread prints it and drops the "
            f"tensor, and put returns normally (as in non-leaf-put). Fix: keep fewer sent "
            f"tensors alive in the sender (keep=False, or a few reused buffers), raise "
            f"`ulimit -n`, or use strategy='file_system'.")
    why = ("it dropped each tensor once sent, so its fds closed as it went"
           if not prm["keep"] else "under 'file_system' a segment is held by its name, "
           "with no fd kept open" if prm["strategy"] == "file_system" else
           "that many fit under its limit")
    return "ok", (
        f"The producer sent all {details['sent']} tensors under a limit of {prm['limit']} fds "
        f"(open fds: {details['start_fds']} → peak {details['peak_fds']}): {why}. The consumer "
        f"got {details['consumer_got']}.")
