"""The Figure every mpviz picture is drawn on: a matplotlib Figure that shows itself in a notebook.

IPython shows an object as a picture when it has a ``_repr_png_`` method. A plain
``matplotlib.figure.Figure`` made without pyplot has none (pyplot's inline backend is what
normally displays figures), so without ``%matplotlib inline`` a notebook would print
``<Figure size 1250x300 with 1 Axes>``. This subclass renders itself to PNG bytes with the Agg
canvas (no pyplot, no window, nothing to close).

``without_gc``: each picture is drawn with Python's cyclic collector off (trace.without_gc: a
trace holds hundreds of thousands of objects, and each collection that walks them all finds
nothing to free), on again after.
"""
import functools
import io

from matplotlib.figure import Figure as _MplFigure

from ..trace.trace import without_gc as _no_gc


def without_gc(draw):
    """`draw` (timeline, memory_map, wait_for) run with the cyclic garbage collector off."""
    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with _no_gc():
            return draw(*args, **kwargs)
    return drawn


class Figure(_MplFigure):
    """A ``matplotlib.figure.Figure`` that a notebook shows as a PNG (``_repr_png_``)."""

    repr_dpi = 100

    def _repr_png_(self):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        if self.canvas is None or not hasattr(self.canvas, "print_png"):
            FigureCanvasAgg(self)
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=self.repr_dpi, bbox_inches="tight")
        return buf.getvalue()
