"""mpviz.nn.parallel: :class:`DistributedDataParallel`, as ``torch.nn.parallel``."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
