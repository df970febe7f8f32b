"""queue-sharing: ``put`` moves a tensor into shared memory; the second put copies nothing.

What happens: a tensor is born in ordinary (private) memory. The first time it is put on a
queue, mpviz -- like torch -- moves its storage into shared memory *in place*: it allocates a
segment, copies the bytes there once (a ``copy`` event, sized by the bytes), and from then on the
tensor's data lives in the segment. What travels through the queue is only a handle (a name or
a file descriptor), under 200 bytes however big the tensor. The receiver maps the same
segment: its writes are the sender's writes. A second put of the same tensor copies nothing:
it is already shared, and the receiver's cache hands back the storage it already maps::

    parent  t = zeros(n)  [private]                     child
            put(t) ─ copy n bytes into shm ─ handle ──▶ get() → a view of the same segment
            put(t) ─ (already shared: no copy) handle ─▶ get() → the same storage again
                                                         fill_(7) ─▶ the parent sees 7s

Why it matters: sharing is cheap to *send* but the first put pays a copy; the lesson of
``buffer-reuse`` builds on this.
"""
from .. import zeros
from ._common import check_between, context, get, kib, start_method_param, step, strategy_param
from .base import Param

SUMMARY = "a put moves the storage to shared memory; the second put copies nothing"
PARAMS = {
    "start_method": start_method_param("fork"),
    "strategy": strategy_param(),
    "numel": Param(65536, None, "float32 elements in the tensor (64K = 256 KiB)"),
}


def check_params(p):
    check_between(p, "numel", 1, 4 << 20, " (16 MiB of float32)")


def receive_twice_and_write(q, out):
    a = q.get()
    b = q.get()
    same = a.untyped_storage() is b.untyped_storage()
    a.fill_(7.0)
    step("child wrote 7s into the tensor it received")
    out.put({"same_storage": same, "shared": a.is_shared()})


def drive(p, details):
    ctx = context(p)
    q, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receive_twice_and_write, args=(q, out), name="child")
    child.start()
    t = zeros(p["numel"])
    details["shared_before_put"] = t.is_shared()
    step("first put")
    q.put(t)
    details["shared_after_put"] = t.is_shared()
    step("second put of the same tensor")
    q.put(t)
    details.update(get(out, what="the child's report"))
    details["parent_sees_child_write"] = bool(t[0].item() == 7.0)
    child.join()


def verdict(t, details):
    driver = details.get("driver_pid")
    copies = [e for e in t.of_kind("copy") if e.pid == driver]
    nbytes = sum(e.args.get("nbytes") or 0 for e in copies)
    details["copies"], details["bytes_copied"] = len(copies), nbytes
    strategy = details["params"]["strategy"]
    ok = (len(copies) == 1 and details.get("parent_sees_child_write")
          and details.get("same_storage"))
    text = (f"The first put copied the tensor into shared memory once ({kib(nbytes)}, one "
            f"'copy' mark on the parent's lane; is_shared() went from "
            f"{details.get('shared_before_put')} to {details.get('shared_after_put')}). Under "
            f"'{strategy}' each put sent only a small handle (the arrows). The second put copied "
            f"nothing, and the child got the very same storage back "
            f"(same_storage={details.get('same_storage')}). The child's fill_(7) was "
            f"{'visible' if details.get('parent_sees_child_write') else 'NOT visible'} in the "
            f"parent: both map one segment.")
    if ok:
        return "ok", text
    return "error", f"Not what sharing promises ({len(copies)} copies). {text}"
