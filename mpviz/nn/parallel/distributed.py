"""DistributedDataParallel: every rank trains the same model on its own part of each batch.

    rank 0: batch[0::W] ─ forward ─ backward ─┐                       ┌─ step ─▶ same weights
    rank 1: batch[1::W] ─ forward ─ backward ─┼─ all_reduce(grads)/W ─┤
    ...                                       ┘   (one flat bucket)   └─ step ─▶ same weights

1. At construction, rank 0's parameters are broadcast, so every rank starts from the same ones.
2. ``forward`` runs the wrapped module and puts one node on top of its output. In ``backward``
   that node is reached first; it *queues a callback* on the autograd engine
   (:func:`mpviz.autograd.queue_callback`), which runs once every ``.grad`` is filled.
3. The callback copies all gradients into one flat buffer, ``all_reduce``\\ s it (SUM) and
   divides by the world size: each rank now holds the gradient of the whole batch's mean loss,
   the same on every rank -- so the optimizers' steps keep the models equal.

Adapted from torch's ``nn/parallel/distributed.py`` and its C++ ``Reducer``; simplified: one
bucket (torch cuts the gradients into ~25 MiB buckets and all-reduces each as soon as its
gradients are ready, overlapping with the rest of backward), no ``find_unused_parameters``, no
buffers to broadcast (mpviz.nn has none), no ``no_sync``.
"""
import numpy as np

from ... import autograd
from ... import distributed as dist
from ..module import Module


class DistributedDataParallel(Module):
    """Wrap `module` so that its gradients are averaged over the ranks of `process_group`."""

    def __init__(self, module, device_ids=None, output_device=None, process_group=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps an mpviz.nn.Module, not "
                            f"{type(module).__name__}. Fix: DistributedDataParallel(model).")
        if not dist.is_initialized():
            c10d = dist.distributed_c10d
            raise ValueError(f"{c10d._NOT_INIT_WHAT} DistributedDataParallel all-reduces the "
                             f"gradients through it. {c10d._NOT_INIT_FIX}")
        self.module = module
        self.process_group = process_group
        group = process_group or dist.distributed_c10d._group(None, "DistributedDataParallel")
        src = group.members[0]
        for p in module.parameters():             # everyone starts from the first rank's weights
            dist.broadcast(p.data, src=src, group=process_group)

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if not getattr(out, "requires_grad", False):
            return out

        def backward(g):
            autograd.queue_callback(self._average_gradients)
            return (g,)
        return autograd._result(out._np, (out,), "DistributedDataParallelBackward", backward)

    def _average_gradients(self):
        params = [p for p in self.module.parameters() if p.grad is not None]
        if not params:
            return
        bucket = np.concatenate([p.grad.numpy().reshape(-1) for p in params])
        dist.all_reduce(bucket, group=self.process_group)
        bucket /= dist.get_world_size(self.process_group)
        at = 0
        for p in params:
            n = p.grad.numel()
            p.grad.numpy()[...] = bucket[at:at + n].reshape(p.grad.shape)
            at += n
