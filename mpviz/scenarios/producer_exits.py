"""producer-exits: the consumer's second ``get`` comes after the producer exited, and fails.

This is the example of the tutorial "Multiprocessing in Python and PyTorch" (the one notebook
01 follows), with its seconds scaled down to ``unit``::

    producer  put(t1) put(t2) ── sleeps 3 units ── exits ✗
    consumer  get(t1) ✓ ── sleeps 4 units ──────────────────── get(t2) ✗ connection refused

Why: under ``file_descriptor`` (Linux's default) a tensor on a queue is not the memory, it is a
promise: "process P will hand you a descriptor when you ask". The consumer asks when it
*unpickles*, i.e. in ``get``. The first get is served; by the second, P has exited and nobody
answers (torch: ``ConnectionRefusedError``/``FileNotFoundError``; mpviz:
``ProducerExitedError``, pitfall #6). Under ``file_system`` the handle is a name in /dev/shm,
which outlives the producer, so the same timing works.

The fix: keep the producer alive until the consumer has what it needs -- ``wait=True`` makes the
producer wait on an ``Event`` that the consumer sets after its last get.
"""
import time

from .. import randn
from ._common import check_between, headline, context, get, start_method_param, step, strategy_param
from .base import Param

SUMMARY = "consumer's get after the producer exited fails (the tutorial's example)"
PARAMS = {
    "wait": Param(False, [False, True], "the producer waits on an Event set by the consumer"),
    "strategy": strategy_param("file_descriptor", "file_system: the name outlives the producer"),
    "unit": Param(0.25, None, "seconds per tutorial second (the producer sleeps 3, the "
                              "consumer 4)"),
    "start_method": start_method_param("spawn", "the tutorial uses spawn"),
}
STALL_SECONDS = 4.0


def check_params(p):
    check_between(p, "unit", 0.05, 2, " seconds")


def foo(q, unit, consumed=None):
    q.put(randn(20, 20))
    q.put(randn(10, 10))
    if consumed is not None:
        step("producer waits until the consumer is done")
        consumed.wait(20)
    else:
        time.sleep(3 * unit)
    step("producer exits")


def bar(q, out, unit, consumed=None):
    t1 = q.get()
    out.put(("got", list(t1.size())))
    time.sleep(4 * unit)
    try:
        t2 = q.get()
        out.put(("got", list(t2.size())))
    except Exception as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    if consumed is not None:
        consumed.set()


def drive(p, details):
    ctx = context(p)
    q, out = ctx.Queue(), ctx.Queue()
    consumed = ctx.Event() if p["wait"] else None
    p1 = ctx.Process(target=foo, args=(q, p["unit"], consumed), name="producer")
    p2 = ctx.Process(target=bar, args=(q, out, p["unit"], consumed), name="consumer")
    p1.start()
    p2.start()
    details["gets"] = [get(out, what="the consumer's first get", sender=p2),
                       get(out, what="the consumer's second get", sender=p2)]
    p1.join()
    p2.join()
    details["producer_pid"], details["consumer_pid"] = p1.pid, p2.pid


def verdict(t, details):
    prm = details["params"]
    procs = {p.pid: p for p in t.processes()}
    prod = procs.get(details.get("producer_pid"))
    exited = f"{(prod.exit_ns - prod.start_ns) / 1e9:.2f} s after it started" if prod and \
        prod.exit_ns else "early"
    errors = [g[1] for g in details.get("gets", []) if g[0] == "error"]
    if errors:
        return "error", (
            f"The consumer got the first tensor while the producer was alive, then slept; the "
            f"producer exited ({exited}), and the second get failed: {headline(errors[0])} Under "
            f"'file_descriptor' a queued tensor is a promise by its producer to hand over a "
            f"descriptor when asked, and an exited process keeps no promises (on the timeline: "
            f"the second arrow ends after the producer's lane). Fix: the producer waits on an "
            f"Event the consumer sets (wait=True), or use strategy='file_system'.")
    how = ("the producer waited on an Event the consumer set after its last get" if prm["wait"]
           else "under 'file_system' the handle is a name in /dev/shm, which outlives its producer")
    return "ok", f"Both gets succeeded ({[g[1] for g in details['gets']]}): {how}."
