"""Small, importable examples that the notebooks, tests and benchmarks share.

They live in a package, not in notebook cells, because ``spawn`` and ``forkserver`` children find
a worker function by importing it by name (see :mod:`mpviz.multiprocessing.checks`).

* :mod:`~mpviz.examples.data` — ``make_blobs`` (a synthetic classification data set) and
  ``data_loader`` (shuffled mini-batches);
* :mod:`~mpviz.examples.model` — ``MyModel``, a two-layer MLP for that data;
* :mod:`~mpviz.examples.training` — the Hogwild worker ``train``, ``accuracy``, ``run_hogwild``;
* :mod:`~mpviz.examples.hogwild` — the Hogwild example of torch's multiprocessing notes, runnable
  as ``python -m mpviz.examples.hogwild``.
"""
from .data import data_loader, make_blobs
from .training import accuracy, run_hogwild, train
from .model import MyModel

__all__ = ["make_blobs", "data_loader", "MyModel", "train", "accuracy", "run_hogwild"]
