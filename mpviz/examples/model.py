"""``MyModel``: the model that torch's Hogwild example imports (``from model import MyModel``).

A two-layer perceptron for :func:`mpviz.examples.data.make_blobs`::

    x (N, 2) ── fc1 ──▶ (N, 32) ── relu ──▶ fc2 ──▶ scores (N, 4)

It takes no required arguments, as in the example, so ``MyModel()`` fits the default data.
"""
from .. import nn
from .data import N_CLASSES, N_FEATURES


class MyModel(nn.Module):
    def __init__(self, n_features=N_FEATURES, hidden=32, n_classes=N_CLASSES):
        super().__init__()
        self.fc1 = nn.Linear(n_features, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))
