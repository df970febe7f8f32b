"""mpviz.utils: what torch.utils has that mpviz needs (``data.DistributedSampler``)."""
