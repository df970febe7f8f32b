"""A synthetic classification data set, and mini-batches of it.

``make_blobs`` puts one Gaussian cloud per class. The class centres sit evenly on a circle in the
first two features (so the data can be drawn in 2-D), any further features are noise::

          class 1
             *                 radius 4, unit spread: neighbouring clouds overlap a little,
    class 2  *   *  class 0    so a good model gets ~99% right and an untrained one about
             *                 1 / n_classes
          class 3

The same ``seed`` gives the same points in every process, so each Hogwild worker can build
its own copy of the data instead of receiving it (as the torch example's comment says:
"Construct data_loader, optimizer, etc." inside ``train``).
"""
import numpy as np

from .. import tensor
from ..tensor import Tensor

N_FEATURES = 2
N_CLASSES = 4


def make_blobs(n=2000, n_features=N_FEATURES, n_classes=N_CLASSES, seed=0, radius=4.0, spread=1.0):
    """`n` points in `n_features` dimensions from `n_classes` clouds: ``(data, labels)``.

    `data` is a float32 tensor of shape (n, n_features); `labels` an int64 tensor of shape (n,).
    """
    for name, value, least in (("n", n, 1), ("n_features", n_features, 2), ("n_classes", n_classes, 2)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"make_blobs({name}=...) must be an int, not {type(value).__name__}")
        if value < least:
            raise ValueError(f"make_blobs({name}=...) must be at least {least}, got {value}")
    rng = np.random.default_rng(seed)
    angles = 2 * np.pi * np.arange(n_classes) / n_classes
    centres = np.zeros((n_classes, n_features))
    centres[:, 0], centres[:, 1] = radius * np.cos(angles), radius * np.sin(angles)
    labels = rng.permutation(np.arange(n) % n_classes)        # balanced classes, shuffled
    data = centres[labels] + spread * rng.standard_normal((n, n_features))
    return tensor(data.astype(np.float32)), tensor(labels.astype(np.int64))


def data_loader(data, labels, batch_size=32, shuffle=True, seed=None, epochs=1):
    """Yield ``(data_batch, labels_batch)`` pairs covering the data set `epochs` times.

    With ``shuffle=True`` each pass visits the points in a new random order drawn from `seed`
    (None: fresh entropy, so two workers get different orders).
    """
    if not isinstance(data, Tensor) or not isinstance(labels, Tensor):
        raise TypeError("data_loader(data, labels) expects two tensors, e.g. from make_blobs()")
    if len(data) != len(labels):
        raise ValueError(f"data and labels must have the same length, got {len(data)} and {len(labels)}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    rng = np.random.default_rng(seed)
    n = len(data)
    for _ in range(epochs):
        order = rng.permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            yield data[idx], labels[idx]
