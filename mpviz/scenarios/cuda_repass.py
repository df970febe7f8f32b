"""cuda-repass: a consumer puts a CUDA tensor it received on another queue.

What happens: a received CUDA tensor maps memory that belongs to its *producer*, which counts
the processes it sent it to and frees it only when they all let go. If the consumer forwarded
it, a third process would hold the memory without being counted, and could be left reading
freed memory. So torch refuses: ``Attempted to send CUDA tensor received from another process;
this is not currently supported. Consider cloning before sending.`` (pitfall #12, the
``q2.put(q1.get())`` pattern)::

    producer  put(x) ──▶ relay: y = get()   q2.put(y)  ✗ refused
                                             q2.put(y.clone()) ✓ ──▶ parent: a copy the relay owns

The fix: ``clone()`` it first: the clone is the relay's own block, counted by the relay.
"""
from ..cuda import examples
from ._common import get, step
from .base import Param

SUMMARY = "a consumer re-puts a received CUDA tensor"
PARAMS = {
    "clone": Param(False, [False, True], "clone() the received tensor before sending it on"),
}
STALL_SECONDS = 5.0


def drive(p, details):
    import mpviz.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, q2, out, done = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    prod = ctx.Process(target=examples.producer, args=(q, done), name="producer")
    relay = ctx.Process(target=examples.relay, args=(q, q2, out, p["clone"], done), name="relay")
    prod.start()
    relay.start()
    status, message = get(out, what="the relay's report", sender=relay)
    details["relay"] = status
    details["message"] = message
    if status == "sent":
        y = q2.get(timeout=20)
        details["forwarded_shape"] = list(y.shape)
        details["forwarded_sum"] = float(y.float().sum().item())
        step("parent received the relay's clone")
        del y
    done.set()
    prod.join()
    relay.join()


def verdict(t, details):
    if details.get("relay") == "refused":
        return "error", (
            f"The relay tried to put the tensor it had received and was refused: "
            f"{details['message']} The block belongs to the producer, which counts only the "
            f"processes it sent it to. Fix: q2.put(x.clone()) (clone=True).")
    return "ok", (f"The relay sent a clone: its own block, counted by the relay; the parent got "
                  f"a {details.get('forwarded_shape')} tensor (sum {details.get('forwarded_sum'):.3f})"
                  f" and the producer's block stayed the producer's business.")
