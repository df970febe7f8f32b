"""The ring all-reduce, step by step: one panel per step, each rank's chunks and what moved.

mpviz.distributed records a ``dist.ring_step`` event each time a rank has read one chunk of its
previous rank's buffer (mpviz/distributed/ring.py): the step, the chunk, from whom. The values
are not recorded (a chunk can be megabytes); given each rank's input, they follow from the
events alone, by doing what each event says, step after step::

    step t, event (rank i, chunk c, recv_from p):
        reduce-scatter (t < W-1):  chunk c of rank i  +=  chunk c of rank p, as it was after t-1
        all-gather     (t >= W-1): chunk c of rank i   =  chunk c of rank p, as it was after t-1

(Exact, not a model: at step t rank p writes chunk c-1, never the chunk c its next rank reads.)
Each panel is a grid, ranks down, chunks across; a cell shows the chunk's value and whose
inputs it holds (``b0+b2``); the cells written at that step are coloured, an arrow from the
rank they were read from. Without inputs, only whose inputs (the ranks' names) are drawn.

    steps = ring_steps(trace, inputs={0: a0, 1: a1, 2: a2})   # [Step], values per rank
    ring(trace, inputs)                                       # the Figure
"""
from typing import NamedTuple

import numpy as np
from matplotlib.patches import Rectangle

from .figure import Figure

REDUCE, GATHER = "#fdd49e", "#a6dba0"     # pale orange: += (reduce-scatter), pale green: = (copy)


class Move(NamedTuple):
    """One chunk read at one step: rank `dst` read chunk `chunk` of rank `src` (`nbytes`)."""
    src: int
    dst: int
    chunk: int
    nbytes: int


class Step(NamedTuple):
    """One step of the ring: what moved, and every rank's chunks after it."""
    step: int                 # -1: the inputs, before the first step
    phase: str                # "inputs", "reduce-scatter" or "all-gather"
    moves: list               # [Move]
    values: dict              # {rank: [chunk values: arrays, or None without inputs]}
    holds: dict               # {rank: [frozenset of the ranks whose input the chunk sums]}


def _ranks_of(trace):
    return {e.pid: e.args["rank"] for e in trace.of_kind("dist.collective", "dist.rendezvous")
            if e.args.get("rank") is not None}


def ring_steps(trace, inputs=None, seq=None, op="all_reduce"):
    """The steps of `op` #`seq` (default: the first one with ring steps), replayed from its
    ``dist.ring_step`` events. `inputs`: {rank: 1-d array} (or a function (rank, W) -> array)."""
    rank_of = _ranks_of(trace)
    events = [e for e in trace.of_kind("dist.ring_step") if e.args.get("op") == op]
    if seq is None:
        seq = _first_seq(trace, op)
    events = [e for e in events if e.args["seq"] == seq]
    if not events:
        which = f"{op} #{seq}" if seq is not None else op
        raise ValueError(f"the trace has no ring steps of {which}. Why: only "
                         f"mpviz.distributed records them (torch's gloo runs its ring in C++), "
                         f"and only with more than one rank. Fix: trace a program that calls "
                         f"mpviz.distributed.{op} on 2 or more ranks.")
    ranks = sorted({rank_of[e.pid] for e in events} | {e.args["recv_from"] for e in events})
    W = len(ranks)
    chunk_count = max(e.args["chunk"] for e in events) + 1
    if callable(inputs):
        inputs = {r: inputs(r, W) for r in ranks}
    values = holds = None
    if inputs is not None:
        arrays = {r: np.asarray(inputs[r]).reshape(-1) for r in ranks}
        n = len(arrays[ranks[0]])
        values = {r: [arrays[r][c * n // W:(c + 1) * n // W].copy() for c in range(W)]
                  for r in ranks}
    holds = {r: [frozenset([r]) for _ in range(max(W, chunk_count))] for r in ranks}
    out = [Step(-1, "inputs", [], _copy(values, ranks), dict(holds))]
    for t in sorted({e.args["step"] for e in events}):
        now = [e for e in events if e.args["step"] == t]
        moves = [Move(e.args["recv_from"], rank_of[e.pid], e.args["chunk"], e.args["nbytes"])
                 for e in now]
        before_v, before_h = _copy(values, ranks), {r: list(h) for r, h in holds.items()}
        holds = {r: list(h) for r, h in holds.items()}
        for m in moves:
            add = t < W - 1
            theirs = before_h[m.src][m.chunk]
            holds[m.dst][m.chunk] = (holds[m.dst][m.chunk] | theirs) if add else theirs
            if values is not None:
                src = before_v[m.src][m.chunk]
                values[m.dst][m.chunk] = values[m.dst][m.chunk] + src if add else src.copy()
        out.append(Step(t, "reduce-scatter" if t < W - 1 else "all-gather", moves,
                        _copy(values, ranks), holds))
    return out


def _copy(values, ranks):
    if values is None:
        return {r: None for r in ranks}
    return {r: [v.copy() for v in values[r]] for r in ranks}


def _label(value):
    if value is None:
        return ""
    shown = [f"{x:g}" for x in value[:3]]
    return ", ".join(shown) + (" …" if len(value) > 3 else "")


def ring(trace, inputs=None, seq=None, op="all_reduce", width=16):
    """One panel per step of `op` #`seq` (ring_steps' arguments): ranks down, chunks across,
    as many panels a row as fit in `width` inches. Returns the Figure."""
    seq = _first_seq(trace, op) if seq is None else seq
    steps = ring_steps(trace, inputs, seq, op)
    ranks = sorted(steps[0].holds)
    W = len(ranks)
    letters = "abcdefghijklmnopqrstuvwxyz"
    name = (lambda c: letters[c]) if W <= len(letters) else str
    panel = 0.8 * W + 0.7
    columns = max(1, min(len(steps), int(width // panel)))
    rows = -(-len(steps) // columns)
    fig = Figure(figsize=(panel * columns, 0.75 * W * rows + 1.3 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[len(steps):]:
        ax.set_axis_off()
    for ax, s in zip(axes.flat, steps):
        _panel(ax, s, ranks, W, name)
    fig.suptitle(f"{op} #{seq} on "
                 f"{W} ranks: the ring, step by step (orange: += the chunk read from the "
                 f"previous rank; green: = copied from it)", x=0.01, ha="left", fontsize=10)
    return fig


def _first_seq(trace, op):
    return min((e.args["seq"] for e in trace.of_kind("dist.ring_step")
                if e.args.get("op") == op), default=None)


def _whose(letter, ranks, W):
    """Whose inputs a chunk sums: 'b0+b2'; all of them: 'b0+…+b3' (W > 3: it must fit)."""
    if len(ranks) == W and W > 3:
        return f"{letter}0+…+{letter}{W - 1}"
    return "+".join(f"{letter}{k}" for k in sorted(ranks))


GAP = 1.45                                # from one chunk's column to the next


def _panel(ax, s, ranks, W, name):
    written = {(m.dst, m.chunk): m for m in s.moves}
    colour = REDUCE if s.phase == "reduce-scatter" else GATHER
    row = {r: i for i, r in enumerate(ranks)}
    for r in ranks:
        y = -row[r]
        ax.text(-0.7, y, f"rank {r}", ha="right", va="center", fontsize=9)
        for c in range(W):
            x = c * GAP
            ax.add_patch(Rectangle((x - 0.5, y - 0.4), 1.0, 0.8, lw=0.8, edgecolor="#333333",
                                   facecolor=colour if (r, c) in written else "white"))
            whose = _whose(name(c), s.holds[r][c], W)
            value = _label(s.values[r][c] if s.values[r] is not None else None)
            ax.text(x, y + (0.12 if value else 0), value or whose, ha="center", va="center",
                    fontsize=10 if value else 7, fontweight="bold" if value else "normal")
            if value:
                ax.text(x, y - 0.22, whose, ha="center", va="center", fontsize=6.5,
                        color="#444444")
    for m in s.moves:       # the read: from the previous rank's same chunk, in the gap beside it
        x, y0, y1 = m.chunk * GAP + 0.5, -row[m.src], -row[m.dst]
        rad = 0.35 / abs(y1 - y0) * (1 if y1 > y0 else -1)       # always bowing to the right
        ax.annotate("", xy=(x, y1), xytext=(x, y0),
                    arrowprops=dict(arrowstyle="-|>", color="#555555", lw=1.1, shrinkA=4,
                                    shrinkB=4, connectionstyle=f"arc3,rad={rad:.3f}"))
    for c in range(W):
        ax.text(c * GAP, 0.55, f"chunk {name(c)}", ha="center", va="bottom", fontsize=8)
    title = "the inputs" if s.step < 0 else f"step {s.step}: {s.phase}"
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_xlim(-1.7, (W - 1) * GAP + 0.9)
    ax.set_ylim(-(W - 1) - 0.6, 0.9)
    ax.set_axis_off()
