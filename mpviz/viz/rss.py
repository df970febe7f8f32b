"""Each process's memory as it grows: the ``mem.rss`` samples of a trace, one line per process.

A scenario that watches memory (``oom-killed``) reads each worker's resident memory (VmRSS in
``/proc/PID/status``) from its driver a few times a second and records it as a ``mem.rss``
event: ``{of: pid, rss: bytes}``. This draws them at true time (seconds since the trace began,
like the timeline's axis but without squeezing idle stretches), and marks how each sampled
process ended: a cross for a process killed by a signal (crimson for SIGKILL, the OOM killer's;
grey for another, the SIGTERM the others get), named in a column right of the plot.
:func:`memory_lines` draws any such lines (notebook 13 draws its DataLoader workers' RSS or USS,
read from outside by mpviz/examples/dataloader_watch.py)::

    MiB
    150 ┤        ╭──✗ SIGKILL (rank 1)
    100 ┤    ╭───╯  ✗ SIGTERM (rank 0)
     50 ┤ ───╯
        └──────────────────────▶ s
"""
from .colors import COLORS
from .figure import Figure
from ..trace.analysis import process_labels


def rss_lanes(trace, ax=None, limit_mb=None, title=None):
    """Draw the ``mem.rss`` samples of `trace`; return the Figure.

    `limit_mb`: also draw this as a dashed line (say in `title` what it limits). Processes
    without samples are left out; a trace with none says so in the picture.
    """
    samples, ranks = {}, {}
    for e in trace.of_kind("mem.rss"):
        samples.setdefault(e.args["of"], []).append((e.ts_ns, e.args["rss"]))
        if e.args.get("rank") is not None:
            ranks[e.args["of"]] = e.args["rank"]
    if not samples:
        return memory_lines([], ax=ax, empty="no memory samples (mem.rss events) in this trace")
    t0 = trace.events[0].ts_ns
    labels = process_labels(trace)
    ends = {p.pid: p for p in trace.processes()}
    lines = []
    for pid, points in sorted(samples.items()):
        p = ends.get(pid)
        if p is not None and p.exit_ns is not None and p.exit_ns > points[-1][0]:
            points = points + [(p.exit_ns, points[-1][1])]    # the last value, until it ended
        name = labels.get(pid, f"pid {pid}")
        label = f"rank {ranks[pid]} ({name})" if pid in ranks else name
        who = f"rank {ranks[pid]}" if pid in ranks else name.split("\n")[0]
        lines.append((label, [(ts - t0) / 1e9 for ts, _ in points],
                      [rss / (1 << 20) for _, rss in points],
                      (p.signal, who) if p is not None and p.signal else None, "-"))
    return memory_lines(lines, ax=ax, limit_mb=limit_mb, title=title)


def memory_lines(lines, ax=None, limit_mb=None, title=None, ylabel="resident memory (MiB)",
                 xlabel="time since the trace began (s)", empty="no memory samples",
                 first_under=False):
    """Draw memory over time, one line per process; return the Figure.

    `lines`: [(label, seconds, MiB, end, style)]: `end` is None or (signal name, who) for a
    process killed by a signal (a cross: crimson for SIGKILL, grey for another, named right of
    the plot); `style` a matplotlib line style ("-", ":", "--"). `limit_mb`: a dashed line.
    `first_under`: draw the first line wide and pale under the others, for processes that grow
    together (two workers of one loader), whose lines would otherwise hide one another.
    """
    fig = ax.figure if ax is not None else Figure(figsize=(9, 3.2), layout="constrained")
    ax = ax or fig.add_subplot()
    if not lines:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
        return fig
    ends_drawn = []                         # (y, label, colour, cross) of each process killed
    for i, (label, xs, ys, end, style) in enumerate(lines):
        under = first_under and i == 0 and len(lines) > 1
        ax.step(xs, ys, where="post", lw=3.4 if under else 1.6, alpha=0.55 if under else 1,
                ls=style, label=label)
        if end is not None:
            signal_name, who = end
            color = COLORS["deadlock"] if signal_name == "SIGKILL" else "#555555"
            ax.plot([xs[-1]], [ys[-1]], marker="x", ms=9, mew=2.2, color=color)
            ends_drawn.append((ys[-1], f"{signal_name} ({who})", color, (xs[-1], ys[-1])))
    top_mb = max(max(ys, default=0) for _, _, ys, _, _ in lines) or 1
    _label_ends(ax, ends_drawn, top_mb)
    if limit_mb is not None:
        ax.axhline(limit_mb, color="#555555", ls="--", lw=1)
        ax.annotate(f"limit {limit_mb} MiB", (1, limit_mb), xycoords=("axes fraction", "data"),
                    xytext=(-2, 2), textcoords="offset points", ha="right", fontsize=8,
                    color="#555555")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="best", framealpha=0.9, edgecolor="none")
    ax.set_title(title or "Memory of each process as it grows (VmRSS, sampled from /proc)",
                 loc="left", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig


def _label_ends(ax, ends, top_mb):
    """Name each cross in a column right of the plot, highest first, never on top of each other.

    The OOM killer's SIGKILL and the SIGTERM the others get come within milliseconds and at
    nearly the same memory: labels placed beside their crosses would cover each other (and the
    crosses). Each label gets a thin line to its cross instead.
    """
    gap = top_mb * 0.09                     # at least this far apart (MiB), about one text line
    y_prev = None
    for y, text, color, xy in sorted(ends, key=lambda e: -e[0]):
        ty = y if y_prev is None else min(y, y_prev - gap)
        y_prev = ty
        ax.annotate(text, xy, xytext=(1.02, ty), textcoords=("axes fraction", "data"),
                    fontsize=8, va="center", color=color, annotation_clip=False,
                    arrowprops=dict(arrowstyle="-", color=color, lw=0.6, shrinkA=0, shrinkB=4))
