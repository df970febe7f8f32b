"""grad-sharing: ``.grad`` travels with a tensor when it exists; a grad made in the child stays there.

What happens: pickling a tensor for a queue sends its storage (shared) and, in mpviz as in
torch's multiprocessing note ("If torch.Tensor.grad is not None, it is also shared"), its
``.grad`` too, shared the same way. So a child that receives a parameter whose grad exists can
write into that grad and the parent sees it. But a grad the *child* creates (the tensor arrived
with ``grad is None``, the child's backward pass made one) is a new, private tensor in the
child: the parent's ``.grad`` stays ``None``::

    parent  a.grad = zeros  put(a) ─▶ child: a.grad.fill_(5)   ─▶ parent's a.grad is 5s
    parent  b.grad = None   put(b) ─▶ child: b.grad = ones(...) ─▶ parent's b.grad is None

Caveat (mpviz's reductions.py says it too): real torch does not do this. Torch 2.13 drops
``.grad``: its receiver sees ``None``, through a Queue and as a spawn argument (notebook 02 runs
real torch to show it). mpviz keeps the docs' behaviour, its specification. Either way the
lesson for Hogwild holds: gradients are per process; share the *parameters* (``model.share_memory()``), not the grads.
"""
from .. import ones, zeros
from ._common import context, get, start_method_param, step, strategy_param

SUMMARY = ".grad travels when it exists; one made in the child stays there"
PARAMS = {
    "start_method": start_method_param("fork"),
    "strategy": strategy_param(),
}


def touch_grads(q, out):
    a, b = q.get(), q.get()
    report = {"a_grad_arrived": a.grad is not None, "b_grad_arrived": b.grad is not None}
    if a.grad is not None:
        a.grad.fill_(5.0)
        report["a_grad_shared"] = a.grad.is_shared()
        step("child wrote 5s into a.grad")
    b.grad = ones(*b.shape)
    step("child made a new b.grad of its own")
    out.put(report)


def drive(p, details):
    ctx = context(p)
    q, out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=touch_grads, args=(q, out), name="child")
    child.start()
    a, b = zeros(4, requires_grad=True), zeros(4, requires_grad=True)
    a.grad = zeros(4)
    q.put(a)
    q.put(b)
    details.update(get(out, what="the child's report"))
    child.join()
    details["parent_a_grad"] = a.grad.tolist()
    details["parent_b_grad_is_none"] = b.grad is None


def verdict(t, details):
    seen = details.get("parent_a_grad") == [5.0] * 4
    text = (f"a.grad existed when a was put: it travelled "
            f"(arrived: {details.get('a_grad_arrived')}, shared: {details.get('a_grad_shared')}), "
            f"and the child's fill_(5) {'shows' if seen else 'does NOT show'} in the parent's "
            f"a.grad. b had no grad; the child made one, and the parent's b.grad "
            f"{'is still None' if details.get('parent_b_grad_is_none') else 'changed'}: a grad "
            f"made in a child stays in that child. (This is the docs' behaviour, which mpviz "
            f"keeps: real torch 2.13 drops .grad, and its receiver sees None.) For "
            f"Hogwild: share the parameters; each worker keeps its own grads.")
    ok = seen and details.get("parent_b_grad_is_none") and not details.get("b_grad_arrived")
    return ("ok" if ok else "error"), text
