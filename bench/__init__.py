"""mpviz's benchmarks: mpviz against torch.multiprocessing, the stdlib and the floor.

Run ``python -m bench`` (``--quick`` for a smoke run); see :mod:`bench.run` for how it measures.
"""
