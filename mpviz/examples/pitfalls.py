"""Helpers for notebook 11 (more pitfalls): print a scenario's verdict, wrapped to read.

Every process of the notebook's lessons is started by a scenario (``mpviz.scenarios``), in a
driver process of its own, never by the notebook's kernel: a kernel has threads, and forking it
would be a pitfall of its own (see fork-held-lock). The notebook's exercises are checked by
``mpviz.exercises.check``, like every notebook's::

    show(result)                               the verdict, wrapped to read
"""
import textwrap

__all__ = ["show"]


def _params(params):
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "the defaults"


def show(result, width=100):
    """Print a scenario's outcome and its explanation, wrapped."""
    print(f"{result.name} ({_params(result.params)}): {result.outcome.upper()}")
    for paragraph in result.explanation.split("\n\n"):
        print(textwrap.fill(paragraph, width))
