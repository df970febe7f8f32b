"""mpviz.utils.data: :class:`DistributedSampler`, as ``torch.utils.data``."""
from .distributed import DistributedSampler

__all__ = ["DistributedSampler"]
