"""The memory map: which process maps which shared-memory segment, and what is left behind.

                       main      producer   consumer    │ at the end
    mpviz_fd_27… (fd, 391 KiB)     created    maps it     │ in use
    mpviz_e5ba… (fs, 4 KiB)        created ✝               │ LEAKED

Rows are segments (in the order they were created), columns are processes; a cell says what
that process did with that segment *up to the instant* ``at`` (default: the trace's end):
created it, maps it now (green), mapped it and let go, died while still mapping it, unlinked it.
The last column is the segment's fate, worked out by analysis.py (``_Index.segment_states``):

* ``file_system`` segments have a name in /dev/shm. They are freed only when *unlinked* and
  unmapped; one that nobody maps and nobody unlinked is **leaked** (purple): it stays in RAM
  until reboot (unless mpviz's shm manager removes it: pass ``check_os=True`` to look).
* ``file_descriptor`` segments have no name (the fd is all there is): the kernel frees them when
  the last process unmaps and closes them, so they cannot leak past their processes.

``check_os=True`` compares with what Linux says now: ``/proc/PID/maps`` of the processes still
alive (a ✓ where it agrees, ✗ where it does not) and whether the name is still in /dev/shm —
and, for a name still there that nobody maps, asks the shm manager what will become of it
(:func:`mpviz.sharing.shm_manager.fate`): in flight in a queue a live process can still read,
unreachable (its queue is gone: the manager removes it), or leaked.
"""
import textwrap

from matplotlib.patches import Rectangle

from ..trace import analysis as st
from ..trace.names import human_bytes
from .colors import COLORS, legend
from .figure import Figure, without_gc
from mpviz.trace.osview import os_view
from mpviz.trace.trace import UNKNOWN

IN_FLIGHT = "#fde9b6"   # pale amber: nobody maps it, but a handle to it is on its way


@without_gc
def memory_map(trace, at=None, ax=None, check_os=False, max_segments=30, title=None):
    """Draw processes × shared-memory segments at instant `at` (None: the end); return the Figure.

    * Real torch's segments: their creation and mapping are seen (torch_hooks.py), their unmap
      is not (torch frees a storage in C++) -- it is read from /proc/PID/maps instead, every few
      segments a process maps, so a segment can still be drawn mapped a little after torch let
      go of it. A cell says "mapped it (unmap not seen)", never "maps it", and the fate "in
      use, unless torch has let go".
    * Nobody maps it is not always lost: a handle to it may still be **in flight** in a queue, and
      arrive later (a producer put a tensor and exited). From the trace alone, a ``file_system``
      segment nobody maps while a message put by one of its holders has not been got yet is drawn
      "in flight?": that message may carry it (the trace does not say which memory a message
      names).

    The steps: the rows and columns, a row of cells per segment with its fate
    (``_draw_segment``), the names of rows and columns, the title (``_summary``), the legend."""
    ix = st._index(trace)
    t = ix.t1 if at is None else int(at)
    segs = ix.segment_states(t)
    shown, hidden = segs[:max_segments], segs[max_segments:]
    started = [p for p in ix.procs.values() if p.start_ns <= t]
    involved = [p for p in started if any(p.pid in (s.created_by, s.unlinked_by) or
                                          p.pid in s.mapped_ever for s in segs)]
    procs = started if len(started) <= 12 else involved[:12]
    ncols, nrows = len(procs) + 1, max(1, len(shown) + (1 if hidden else 0))
    if ax is None:
        fig = Figure(figsize=(min(16, 3.2 + 1.55 * ncols + 3.2), 1.6 + 0.48 * nrows),
                     layout="constrained")
        ax = fig.add_subplot()
    fig = ax.figure
    views = _os_views(procs, ix, t) if check_os else {}
    used, fates = set(), []
    for r, s in enumerate(shown):
        fates.append(_draw_segment(ax, r, s, procs, ix, t, views, check_os, used))
    if hidden:
        total = sum(s.nbytes or 0 for s in hidden)
        leaked = sum(s.status == "leaked" for s in hidden)
        ax.text(ncols / 2, len(shown) + 0.5, f"… and {len(hidden)} more segments "
                f"({human_bytes(total)}, {leaked} leaked)", ha="center", va="center",
                fontsize=8, color="#555555")
    if not segs:
        ax.text(ncols / 2, 0.5, "no shared-memory segment recorded (yet)", ha="center",
                va="center", fontsize=9, color="#555555")
    _name_rows_and_columns(ax, procs, shown, ix, t, at, nrows)
    when = "" if at is None else f" at {(t - ix.t0) / 1e6:.1f} ms"
    leaked = [s for s, f in zip(shown, fates) if f == "LEAKED"] + \
        [s for s in hidden if s.status == "leaked"]
    summary = _summary(trace, segs, fates, leaked)
    ax.set_title(title or f"Who maps which shared-memory segment{when}\n{summary}",
                 loc="left", fontsize=10, color=COLORS["leak"] if leaked else "black")
    _legend(ax, used)
    return fig


def _draw_segment(ax, r, s, procs, ix, t, views, check_os, used):
    """Row `r`: segment `s`'s cell for each process, then its fate; the fate's words (adds
    the legend keys it drew to `used`)."""
    ncols = len(procs) + 1
    for c, p in enumerate(procs):
        words, face = [], "white"
        if s.created_by == p.pid:
            words.append("created")
        if p.pid in s.mapped_by:
            # torch unmaps in C++, where no hook sees it: mapped once, maybe not now
            words.append("mapped it\n(unmap not seen)" if s.name in ix.torch_segments
                         else "maps it")
            face = COLORS["mapped"]
            used.add("mapped")
        elif p.pid in s.died_holding:
            words.append("died holding it")
            face = "#d9d9d9"
            used.add("died")
        elif p.pid in s.mapped_ever and s.created_by != p.pid:
            words.append("mapped, let go")
        if s.unlinked_by == p.pid:
            words.append("unlinked")
        if p.pid in views:
            seen = s.name.lstrip("/") in views[p.pid]
            if seen != (p.pid in s.mapped_by):
                words.append("✗ /proc disagrees")
            elif seen:
                words.append("✓ /proc")
        ax.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor="#cccccc", lw=0.8))
        if words:
            ax.text(c + 0.5, r + 0.5, "\n".join(words) if len(words) > 2 else
                    " · ".join(words), ha="center", va="center", fontsize=7.5)
    status, face, color = _fate(s, ix, t, check_os)
    if status == "in use" and s.name in ix.torch_segments:
        status = "in use, unless torch\nhas let go (unseen)"
    used.add({COLORS["leak"]: "leak", COLORS["freed"]: "freed", IN_FLIGHT: "in flight",
              COLORS["mapped"]: "mapped"}.get(face))
    ax.add_patch(Rectangle((ncols - 1 + 0.08, r), 0.92, 1, facecolor=face,
                           edgecolor="#cccccc", lw=0.8))
    ax.text(ncols - 0.46, r + 0.5, status, ha="center", va="center", fontsize=8,
            color=color, fontweight="bold" if face == COLORS["leak"] else "normal")
    return status


def _name_rows_and_columns(ax, procs, shown, ix, t, at, nrows):
    """Columns named by process (and whether it ended), rows by segment (strategy, size)."""
    ncols = len(procs) + 1
    ax.set_xlim(0, ncols)
    ax.set_ylim(nrows, 0)
    ax.xaxis.tick_top()
    ax.set_xticks([c + 0.5 for c in range(ncols)])
    names = []
    for p in procs:
        gone = "" if ix.alive(p.pid, t) else (f"\n(killed: {p.signal})" if p.signal else
                                             "\n(ended)")
        names.append(f"{ix.labels[p.pid]}\npid {p.pid}{gone}")
    end = "at the end" if at is None else "at this instant"
    ax.set_xticklabels(names + [f"fate {end}"], fontsize=8)
    ax.set_yticks([r + 0.5 for r in range(len(shown))])
    ax.set_yticklabels([f"{_short(s.name)}\n{s.strategy} · {human_bytes(s.nbytes)}"
                        for s in shown], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def _summary(trace, segs, fates, leaked):
    """The title's second line: how much leaked, how many in flight, what was not recorded."""
    flying = sum(f.startswith("in flight in a queue") for f in fates)
    maybe = sum(f.startswith(("in flight?", "maybe in flight")) for f in fates)
    summary = (f"{len(leaked)} leaked: {human_bytes(sum(s.nbytes or 0 for s in leaked))} "
               "left in /dev/shm that no live process maps" if leaked else
               f"{len(segs)} segment(s), none leaked")
    if flying:
        summary += f"; {flying} not mapped, in flight in a queue"
    if maybe:
        summary += f"; {maybe} not mapped but maybe in flight"
    unseen = st.torch_not_recorded(trace)
    if unseen:                              # torch's are unknown: not "0 segments, none leaked"
        summary = "\n".join(textwrap.wrap(f"{len(segs)} segment(s) recorded, not counting "
                                           f"torch's: {unseen}", 90))
    return summary + _not_recorded(trace)


def _legend(ax, used):
    """The legend of the colours drawn, with a process that died mapping and one in flight."""
    leg = legend(ax, [k for k in ("mapped", "leak", "freed") if k in used] or ["mapped"],
                 loc="upper left", bbox_to_anchor=(0.0, -0.02), ncols=4)
    extra = []
    from matplotlib.patches import Patch
    if "died" in used:
        extra.append(Patch(facecolor="#d9d9d9", label="the process ended (killed) while it "
                           "still mapped the segment"))
    if "in flight" in used:
        extra.append(Patch(facecolor=IN_FLIGHT, label="nobody maps it, but a handle to it may "
                           "still be on its way in a queue"))
    if extra:
        ax.legend(handles=leg.legend_handles + extra, loc="upper left",
                  bbox_to_anchor=(0.0, -0.02), ncols=2, frameon=False, fontsize=8)


def _not_recorded(trace):
    """What the trace says it could not see (a program run with -I, torch.distributed), in
    words under the title: a map without it reads as "that is all there was"."""
    missing = [n for n in getattr(trace, "notes", ()) if UNKNOWN in n and
               "torch's shared memory" not in n]          # (torch's own: said just above)
    return "".join("\n" + textwrap.shorten(f"NOT RECORDED: {n}", 110) for n in missing[:2])


def _fate(s, ix, t, check_os):
    """The last column for segment `s`: (words, face colour, text colour)."""
    if s.status == "in use":
        return "in use", COLORS["mapped"], "black"
    if s.status == "freed":
        return "freed", COLORS["freed"], "#777777"
    if s.status == "unlink not seen (torch)":      # torch's manager or C++ unlinks it
        return "unlink not seen\n(torch)", "white", "black"
    if s.status not in ("leaked", "in flight?"):
        return s.status, "white", "black"
    if check_os:
        from mpviz.sharing import shm_manager
        kind, words = shm_manager.fate("/" + str(s.name).lstrip("/"))
        if kind == "gone":
            return "not in /dev/shm now\n(the shm manager\nremoved it)", "white", "black"
        if kind == "in flight":
            pids = words.split("pid ")[-1].split(" ")[0] if "pid " in words else ""
            return ("in flight in a queue\n" + (f"(pid {pids} can get it)" if pids else
                                                 "(channel unseen: kept)"), IN_FLIGHT, "black")
        if kind == "maybe in flight":
            return "maybe in flight\n(no shm manager\nto ask)", IN_FLIGHT, "black"
        if kind == "unreachable":
            return "nobody can get it\nnow (the shm manager\nremoves it)", "white", "black"
        if kind == "held":
            return "mapped now by\n" + words.split("pid ")[-1], COLORS["mapped"], "black"
        return "LEAKED", COLORS["leak"], "white"
    if s.status == "in flight?":
        return "in flight?\n(a message from a\nholder is not got yet)", IN_FLIGHT, "black"
    return "LEAKED", COLORS["leak"], "white"


def _short(name, width=24):
    name = str(name).lstrip("/")
    return name if len(name) <= width else name[:width - 1] + "…"


def _os_views(procs, ix, t):
    """{pid: names mapped} for processes alive at the trace's end and still alive now."""
    views = {}
    for p in procs:
        if p.exit_ns is not None or t < ix.t1:
            continue
        try:
            v = os_view(p.pid)
        except OSError:
            continue
        views[p.pid] = set(v.shm) | set(v.memfd)
    return views
