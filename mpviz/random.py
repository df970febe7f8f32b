"""mpviz's random numbers: one NumPy Generator per process, seeded by ``manual_seed``."""
import os

import numpy as np

_generator = None
_pid = None


def generator():
    """This process's generator (a fresh, differently seeded one in each forked child)."""
    global _generator, _pid
    if _generator is None or _pid != os.getpid():
        _generator, _pid = np.random.default_rng(), os.getpid()
    return _generator


def manual_seed(seed):
    """Seed this process's generator, so that randn/rand repeat."""
    global _generator, _pid
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    _generator, _pid = np.random.default_rng(seed), os.getpid()
    return _generator
