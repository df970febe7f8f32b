"""Worker functions for the ``cuda-*`` scenarios and notebooks (spawn children import them here).

Each reports what it saw on an `out` queue as plain values (block name, reference count,
whether its view is still valid), so a scenario can explain the outcome without timing guesses.

    producer(q, keep_alive, shape)      put one CUDA tensor; wait on `keep_alive` (or not: None)
    consumer(q, out, release, hold)     get it, report, `del` when `release` is set (or keep it)
    relay(q, q2, out, clone, done)      re-put a received tensor: refused unless `clone`
    same_queue(out, two_queues)         put and get one's own CUDA tensor on one queue
"""
import mpviz
import mpviz.multiprocessing as mp
import mpviz.trace  # noqa: F401 - registers the reducers in spawned children
from . import ipc_info, memory_stats


def _info(t):
    info = ipc_info(t)
    return {k: info.get(k) for k in ("block", "role", "refcount", "valid", "producer")}


def producer(q, keep_alive=None, shape=(20, 20)):
    x = mpviz.randn(*shape).cuda()
    q.put(x)
    del x
    if keep_alive is not None:
        keep_alive.wait()


def consumer(q, out, release=None, hold=None):
    x = q.get()
    out.put(("got", tuple(x.shape), _info(x)))
    if release is not None:
        release.wait()
    if hold is not None:
        hold.wait()          # keep x: the producer must keep its block (release late)
    valid = bool(mpviz.cuda.ipc_info(x)["valid"])
    if not valid:                        # the producer freed the block: say so on our lane
        mpviz.trace.mark("read of freed memory", failed="its producer exited and freed it")
    out.put(("read", valid, float(x.float().sum().item())))
    del x
    out.put(("released", memory_stats()["received"]))


def relay(q, q2, out, clone=False, done=None):
    x = q.get()
    try:
        q2.put(x.clone() if clone else x)
        out.put(("sent", None))
    except RuntimeError as e:
        out.put(("refused", str(e)))
    del x
    if done is not None:
        done.wait()


def same_queue(out, two_queues=False):
    q = mp.Queue()
    t = mpviz.ones(3).cuda()
    if two_queues:
        out.put(("kept", t.sum().item()))   # the fix: keep using the tensor you have
        return
    q.put(t)
    try:
        q.get(timeout=30)
        out.put(("got", None))
    except RuntimeError as e:
        out.put(("refused", str(e)))
