"""Each process's memory as it grows: the ``mem.rss`` samples of a trace, one line per process.

A scenario that watches memory (``oom-killed``) reads each worker's resident memory (VmRSS in
``/proc/PID/status``) from its driver a few times a second and records it as a ``mem.rss``
event: ``{of: pid, rss: bytes}``. This draws them at true time (seconds since the trace began,
like the timeline's axis but without squeezing idle stretches), and marks how each sampled
process ended: a red cross for a process killed by a signal, with the signal's name::

    MiB
    150 ┤        ╭──✗ SIGKILL      rank 1
    100 ┤    ╭───╯  ✗ SIGTERM      rank 0
     50 ┤ ───╯
        └──────────────────────▶ s
"""
from .colors import COLORS
from .state import process_labels


def rss_lanes(trace, ax=None, limit_mb=None, title=None):
    """Draw the ``mem.rss`` samples of `trace`; return the Figure.

    `limit_mb`: also draw this as a dashed line (say in `title` what it limits). Processes
    without samples are left out; a trace with none says so in the picture.
    """
    from .figure import Figure
    fig = ax.figure if ax is not None else Figure(figsize=(9, 3.2), layout="constrained")
    ax = ax or fig.add_subplot()
    samples, ranks = {}, {}
    for e in trace.of_kind("mem.rss"):
        samples.setdefault(e.args["of"], []).append((e.ts_ns, e.args["rss"]))
        if e.args.get("rank") is not None:
            ranks[e.args["of"]] = e.args["rank"]
    if not samples:
        ax.text(0.5, 0.5, "no memory samples (mem.rss events) in this trace", ha="center",
                va="center", transform=ax.transAxes)
        return fig
    t0 = trace.events[0].ts_ns
    placed = []                             # (x, y) of the end labels so far: stack close ones
    labels = process_labels(trace)
    ends = {p.pid: p for p in trace.processes()}
    for pid, points in sorted(samples.items()):
        p = ends.get(pid)
        if p is not None and p.exit_ns is not None and p.exit_ns > points[-1][0]:
            points = points + [(p.exit_ns, points[-1][1])]    # the last value, until it ended
        xs = [(ts - t0) / 1e9 for ts, _ in points]
        ys = [rss / (1 << 20) for _, rss in points]
        name = labels.get(pid, f"pid {pid}")
        ax.step(xs, ys, where="post", lw=1.6,
                label=f"rank {ranks[pid]} ({name})" if pid in ranks else name)
        if p is not None and p.signal:
            color = COLORS["deadlock"] if p.signal == "SIGKILL" else "#555555"
            ax.plot([xs[-1]], [ys[-1]], marker="x", ms=9, mew=2.2, color=color)
            near = [y for x, y in placed if abs(x - xs[-1]) < 0.1 and abs(y - ys[-1]) < 10]
            dy = 0 if not near else (6 if ys[-1] >= near[0] else -6)   # away from its neighbour
            placed.append((xs[-1], ys[-1]))
            ax.annotate(f" {p.signal}", (xs[-1], ys[-1]), xytext=(4, dy),
                        textcoords="offset points", fontsize=8, va="center", color=color)
    if limit_mb is not None:
        ax.axhline(limit_mb, color="#555555", ls="--", lw=1)
        ax.annotate(f"{limit_mb} MiB", (0, limit_mb), xytext=(2, 2), textcoords="offset points",
                    fontsize=8, color="#555555")
    ax.set_xlabel("time since the trace began (s)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.set_title(title or "Memory of each process as it grows (VmRSS, sampled from /proc)",
                 loc="left", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig
