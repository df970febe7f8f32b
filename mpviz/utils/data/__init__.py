"""mpviz.utils.data: :class:`DistributedSampler` and :class:`DataLoader`, as ``torch.utils.data``."""
from .dataloader import DataLoader, default_collate, get_worker_info
from .distributed import DistributedSampler

__all__ = ["DataLoader", "DistributedSampler", "default_collate", "get_worker_info"]
