"""shm-wiped: a cleanup of /dev/shm under a live job; the next get finds no such file.

What happens: under ``file_system`` a tensor travels as a *name* in ``/dev/shm``, and the
receiver opens that name when it unpickles the tensor, in ``get()``. Between the put and the get
the name is just a file. A cleanup that removes ``/dev/shm/torch_*`` (a cron job, a "fix" for a
full ``/dev/shm``, another job's epilogue) while the job runs removes names that live processes
still need. The producer keeps its memory (unlinking a name does not unmap it), but the
consumer's get cannot open the name any more: torch says ``unable to open shared memory object
</torch_…> in read-write mode: No such file or directory (2)``; mpviz raises
``SegmentGoneError`` (a ``FileNotFoundError``, errno 2)::

    producer   put(t) ── handle: the name /dev/shm/mpviz_… ──▶ (queue)     keeps t, waits
    cleanup              rm /dev/shm/mpviz_…  (this run's names only)
    consumer                                               get() ✗ No such file or directory

The fix: never clean ``/dev/shm`` under running jobs (``wipe=False``); clean only names that no
live process holds, which is what the shm manager does. Under ``file_descriptor`` the segment
has no name to remove (it is unlinked at once; the fd is the memory), so the same cleanup cannot
hurt it.
"""
import os

from .. import zeros
from ._common import context, get, headline, start_method_param, step, strategy_param
from .base import Param

SUMMARY = "someone cleans /dev/shm under a live job: get() fails with No such file or directory"
PARAMS = {
    "wipe": Param(True, [True, False], "a cleanup removes the run's /dev/shm names between the "
                                       "put and the get"),
    "strategy": strategy_param("file_system", "file_descriptor segments have no name to remove"),
    "start_method": start_method_param("fork"),
}


def produce(q, names, release):
    """Put one tensor, say which segment holds it, and stay alive (holding it) until released."""
    t = zeros(1024)
    q.put(t)                                  # moves t into shared memory, sends its handle
    names.put(t.untyped_storage().segment_name)
    step("producer put its tensor and waits")
    release.wait(20)


def consume(q, out):
    try:
        t = q.get()
        out.put(("got", list(t.shape)))
    except OSError as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def wipe(name):
    """What ``rm -f /dev/shm/mpviz_…`` does to this one name: True if there was a file."""
    try:
        os.unlink("/dev/shm" + name)
        return True
    except FileNotFoundError:
        return False


def drive(p, details):
    ctx = context(p)
    q, names, out, release = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    producer = ctx.Process(target=produce, args=(q, names, release), name="producer")
    producer.start()
    name = get(names, what="the producer's segment name", sender=producer)
    details["segment"] = name
    details["in_dev_shm"] = os.path.exists("/dev/shm" + name)
    if p["wipe"]:
        details["removed"] = wipe(name)
        step("a cleanup removes the run's names from /dev/shm", removed=details["removed"])
    consumer = ctx.Process(target=consume, args=(q, out), name="consumer")
    consumer.start()
    details["get"] = get(out, what="the consumer's report", sender=consumer)
    release.set()
    consumer.join()
    producer.join()


def verdict(t, details):
    prm = details["params"]
    kind, said = details["get"]
    if kind == "error":
        return "error", (
            f"The producer's tensor lived in /dev/shm{details['segment']}; a cleanup removed "
            f"that name while the producer still held the tensor and its handle was in the "
            f"queue. The consumer's get could not open it: {headline(said)} torch says 'unable "
            f"to open shared memory object </torch_…> in read-write mode: No such file or "
            f"directory (2)'. Fix: never clean /dev/shm under running jobs (wipe=False); "
            f"leave it to the shm manager, which removes only names no live process holds.")
    if prm["wipe"] and not details.get("removed"):
        return "ok", (
            f"The cleanup ran, but found nothing to remove: under '{prm['strategy']}' the "
            f"segment's name was unlinked as soon as it was made (the open fd is the memory), "
            f"so the consumer's get worked ({said}).")
    return "ok", (f"Nobody touched /dev/shm while the job ran; the consumer opened the name "
                  f"and got its tensor ({said}).")
