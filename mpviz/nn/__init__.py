"""mpviz.nn: just enough of ``torch.nn`` to write and train a small model.

* :mod:`~mpviz.nn.module` — ``Parameter`` (a tensor a model owns) and ``Module`` (a container
  that finds its parameters by walking its attributes; ``share_memory()`` is the Hogwild line);
* :mod:`~mpviz.nn.layers` — ``Linear``, ``ReLU``, ``Sequential``, ``MSELoss``;
* :mod:`~mpviz.nn.functional` — ``relu``, ``log_softmax``, ``nll_loss``, ``cross_entropy``,
  ``mse_loss``, built from the differentiable ops of :mod:`mpviz.autograd`.
"""
from . import functional
from .layers import Linear, MSELoss, ReLU, Sequential
from .module import Module, Parameter

__all__ = ["Module", "Parameter", "Linear", "ReLU", "Sequential", "MSELoss", "functional"]
