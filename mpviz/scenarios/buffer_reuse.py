"""buffer-reuse: many producers, one consumer -- copies and bytes, with and without sending buffers back.

What happens: every *new* tensor a producer puts on a queue is first moved into shared memory:
a fresh segment and a copy of all its bytes (a ``copy`` event each). A producer that makes a
new tensor per batch pays that for every batch. A producer that keeps a small pool of buffers,
fills them in place, and gets each one back from the consumer when it is done, pays the copy
once per buffer: a buffer that is already shared travels as a handle, and the receive cache
maps it once and hands back the *same* storage when it comes home::

    reuse=False  producer: t = new tensor ─ copy ─▶ put ─▶ consumer   (× every batch)
    reuse=True   producer: buf.fill_() ─▶ put ─▶ consumer ─▶ put back ─▶ producer
                 (copy only the first time each buffer is put)

This is the pattern torch's notes recommend ("Reuse buffers passed through a Queue ... send the
buffers back"), and what DataLoader-like pipelines do with pinned/shared buffer pools.
"""
from .. import full, zeros
from ._common import check_between, context, get, kib, start_method_param, strategy_param
from .base import Param

SUMMARY = "many producers, one consumer: copies and bytes with and without sending buffers back"
PARAMS = {
    "reuse": Param(True, [True, False], "send each buffer back to its producer for reuse"),
    "producers": Param(3, None, "how many producer processes"),
    "batches": Param(8, None, "batches each producer sends"),
    "numel": Param(16384, None, "float32 elements per batch (16K = 64 KiB)"),
    "pool": Param(2, None, "buffers per producer when reusing"),
    "strategy": strategy_param(),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    for key, lo, hi in (("producers", 1, 8), ("batches", 1, 200), ("numel", 1, 1 << 20),
                        ("pool", 1, 16)):
        check_between(p, key, lo, hi)


def producer(rank, q, back, batches, numel, reuse, pool, done):
    free = [zeros(numel) for _ in range(pool)] if reuse else []
    for i in range(batches):
        if reuse:
            buf = free.pop() if free else back.get()      # a buffer the consumer sent back
            buf.fill_(float(i))
        else:
            buf = full((numel,), float(i))                # a new tensor: a new segment, a copy
        q.put((rank, i, buf))
        del buf
    q.put((rank, None, None))
    for _ in range(pool - len(free) if reuse else 0):     # wait until every buffer is home
        back.get()
    done.wait(20)        # under file_descriptor a sender must outlive the gets of its handles


def drive(p, details):
    ctx = context(p)
    q, done = ctx.Queue(), ctx.Event()
    backs = [ctx.Queue() for _ in range(p["producers"])]
    procs = [ctx.Process(target=producer, name=f"producer-{r}",
                         args=(r, q, backs[r], p["batches"], p["numel"], p["reuse"], p["pool"], done))
             for r in range(p["producers"])]
    for proc in procs:
        proc.start()
    details["producer_pids"] = [proc.pid for proc in procs]
    running, received, total = len(procs), 0, 0.0
    while running:
        rank, i, buf = get(q, what="a batch")
        if i is None:
            running -= 1
            continue
        total += float(buf[0].item())
        received += 1
        if p["reuse"]:
            backs[rank].put(buf)           # done with it: home it goes, no copy
        del buf
    details["received"] = received
    done.set()
    for proc in procs:
        proc.join()
    details["exitcodes"] = [proc.exitcode for proc in procs]


def verdict(t, details):
    prm = details["params"]
    pids = set(details.get("producer_pids", []))
    copies = [e for e in t.of_kind("copy") if e.pid in pids]
    nbytes = sum(e.args.get("nbytes") or 0 for e in copies)
    sent = prm["producers"] * prm["batches"]
    details["copies"], details["bytes_copied"], details["batches_sent"] = len(copies), nbytes, sent
    batch = prm["numel"] * 4
    if details.get("received") != sent:
        return "error", f"The consumer got {details.get('received')} of {sent} batches."
    text = (f"{prm['producers']} producers sent {sent} batches of {kib(batch)}; the producers' "
            f"lanes show {len(copies)} 'copy' marks, {kib(nbytes)} copied into shared memory in "
            f"all. ")
    if len(copies) >= sent:
        return "warning", text + (
            "Every batch was a new tensor, so every put moved a new storage into shared memory: "
            "a new segment and a full copy each time. Fix: keep a pool of buffers per producer, "
            "fill them in place, and have the consumer send each one back (reuse=True).")
    return "ok", text + (
        f"Each producer copied only its {prm['pool']} buffers, once; after that a buffer "
        f"travelled as a handle both ways and came home as the same storage (the receive "
        f"cache), so {sent - len(copies)} copies were saved.")
