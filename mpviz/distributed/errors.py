"""The errors of mpviz.distributed, with torch.distributed's class names.

torch raises ``DistError`` (a ``RuntimeError``) and its subclasses ``DistNetworkError`` (a
socket could not listen or connect) and ``DistStoreError`` (the store timed out); a collective
that times out raises a ``RuntimeError`` from its backend. mpviz keeps the names, so an
``except`` written for torch catches ours, and adds :class:`CollectiveError`, which says *which*
collective and *which* ranks.
"""


class DistError(RuntimeError):
    """Raised when something in mpviz.distributed fails (torch.distributed.DistError)."""


class DistNetworkError(DistError):
    """Raised when the store's socket cannot listen (port in use) or connect (nobody there)."""


class DistStoreError(DistError):
    """Raised when a wait on the store times out (e.g. ranks that never joined)."""


class CollectiveError(DistError):
    """Raised when a collective cannot complete: a timeout, ranks that disagree, a rank that left.

    ``op`` and ``seq`` name the collective (``all_reduce``, its number in the group), ``ranks``
    the ranks at fault (did not arrive, disagree, or left).
    """

    def __init__(self, message, op=None, seq=None, ranks=()):
        super().__init__(message)
        self.op, self.seq, self.ranks = op, seq, list(ranks)

    def __reduce__(self):
        return type(self), (str(self), self.op, self.seq, self.ranks)
