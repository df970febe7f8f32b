"""The timeline: what every process (and thread) did, over time, and what travelled between them.

    main            ████████████████████████████████████████████  (life bar: how it ended)
    producer·spawn       ██■■■█████████████████████ exit 0           ■ red: bytes copied into shm
                           \\ \\ \\                                    arrows: put ──► get
    consumer·spawn          ▼  ▼  ▼ ░░░░░(waiting)░░░ ████ exit 0     green: a handle travelled
                                                                      red: a big pickled copy

One row per process (its main thread), and under it one sub-row per other thread that did
something: a Queue's feeder thread, say (``└ QueueFeederThread``), which writes a large item into
the pipe when ``put`` could not. An arrow starts where ``put`` was called; it is green when its
sender pickled a handle into the message (``trace/analysis.py``). A thin dashed arrow is a file
descriptor passed over a Unix socket (SCM_RIGHTS) for such a handle, from the thread that sent
it to the one that received it (torch's ``_serve`` thread answers the consumer; the consumer's
request to ``_serve`` is a grey arrow, read off the hand-over: not a message of the trace,
``analysis.fd_requests``). A magenta ✗
marks an action that failed, with what failed beside it (``analysis.failures``); ▸ a message put
and never got. Colours are mpviz.viz.colors' vocabulary.

Large traces stay fast because nothing invisible is drawn: event ticks are binned to about one
per pixel column, and above ``max_arrows`` messages the arrows are bundled per pair of rows and
time bin (one line per bundle, thicker for more messages). The numbers are collected with NumPy
and drawn as a handful of collections, not one artist per event.
"""
import bisect
import math
import operator
import re
from collections import defaultdict

import numpy as np
from matplotlib.artist import Artist
from matplotlib.collections import LineCollection, PatchCollection
from matplotlib.colors import to_rgba
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.path import Path

from . import collectives
from ..trace import analysis as st
from ..trace.events import Request
from ..trace.names import human_bytes
from .colors import BIG_MESSAGE, BLOCKED_FILL, COLORS, legend
from .figure import Figure, without_gc

_MIN_SQUEEZE_NS = 20_000_000  # only stretches of 20 ms or more are squeezed
_BINS = 700                   # a tick column per 1-2 px of the lanes (~870 px at 10 in)


@without_gc
def timeline(trace, ax=None, at=None, title=None, max_arrows=300, max_labels=24,
             compress_idle=True, fast=False):
    """Draw `trace` as one lane per process; return the Figure.

    `ax`: draw into these axes instead of a new figure. `at`: an instant (``ts_ns``) to mark with
    a vertical line. `max_arrows`: above this many messages, arrows are bundled. `max_labels`:
    byte labels are written on arrows and copies only when there are at most this many.
    `compress_idle`: squeeze long stretches where nothing was recorded (a spawn start-up, a
    sleep) to a narrow band marked "≈", so the busy parts get the width. `fast`: no legend and
    fixed margins (about 3× quicker; the Live widget redraws this way and shows the legend once).

    The steps, in the order they draw (later ones over earlier ones, and their labels placed
    after theirs): lay out the lanes (``_Lanes``), then ``_Picture``'s methods, one per thing
    drawn: lives, lock waits and holds, blocked waits, collectives, Pool tasks, event ticks,
    marks, copies, messages, failures, STUCK boxes, CUDA warnings; then the lane names and the
    axes, and the legend with its notes.
    """
    ix = st._index(trace)
    whole, whole_ix = trace, ix       # time is judged on every process, drawn or not
    trace, ix, left_out, deadlocks, thread_lanes = _fewer_lanes(trace, ix)
    fig = ax.figure if ax is not None else None
    if not trace.events:
        fig, ax = _new(fig, ax, 1, fast)
        ax.text(0.5, 0.5, "no events recorded", ha="center", va="center", transform=ax.transAxes)
        return fig
    t0, t1 = whole_ix.t0, max(whole_ix.t1, whole_ix.t0 + 1)
    axis = _TimeAxis(whole, t0, t1, compress_idle)   # squeezed: where nothing at all was recorded
    if deadlocks is None:                         # (lanes were left out: judged again)
        deadlocks = st.deadlocks(trace)
    lanes = _Lanes(ix, deadlocks, thread_lanes, ax)
    owned = ax is None
    fig, ax = _new(fig, ax, len(lanes.rows), fast)
    pic = _Picture(ax, ix, axis, lanes, max_labels, fast)
    pic.draw_lives()
    pic.draw_lock_waits()
    pic.draw_lock_holds()
    pic.draw_blocked()
    pic.draw_collectives(trace)
    pic.draw_tasks()
    pic.draw_ticks()
    pic.draw_marks()
    pic.draw_copies()
    pic.draw_messages(max_arrows)
    pic.draw_failures()
    pic.draw_stuck()
    pic.draw_cuda_warnings()
    pic.name_lanes(at, title, left_out)
    pic.legend_and_notes(fig, owned, getattr(whole, "notes", ()))
    return fig


class _Lanes:
    """The rows of the picture, top to bottom: each process (parents first, then by start), under
    it a row per thread with a lane of its own, and under a stuck one the rows its STUCK
    explanation needs."""

    def __init__(self, ix, deadlocks, thread_lanes, ax):
        procs = sorted((p for p in ix.procs.values() if p.pid not in ix.watchdogs),
                       key=lambda p: (p.ppid in ix.procs and p.ppid not in ix.watchdogs,
                                      p.start_ns))
        self.dead = {d.pid: d for d in deadlocks}
        own_lane, self.folded = thread_lanes         # (_thread_lanes, by _fewer_lanes)
        self.rows, self.row_of, self.proc_row = [], {}, {}
        rows = self.rows
        for p in procs:
            self.proc_row[p.pid] = len(rows)
            self.row_of[(p.pid, p.pid)] = len(rows)
            rows.append(("process", p))
            for tid in p.threads:
                if (p.pid, tid) in own_lane:
                    self.row_of[(p.pid, tid)] = len(rows)
                    rows.append(("thread", (p, tid)))
            if p.pid in self.dead:      # as many rows as its explanation needs, wrapped
                rows += [("reason", p)] * _reason_rows(_stuck_words(self.dead[p.pid]), ax)

    def row(self, pid, tid):
        """The row of thread `tid` of process `pid`: its own lane, else its process's."""
        r = self.row_of.get((pid, tid))
        return r if r is not None else self.proc_row.get(pid, 0)


class _Picture:
    """One timeline being drawn: the axes, the lanes, real time → x, and what the legend and the
    notes under the lanes will say (``used``, ``said``). Each ``draw_*`` method draws one kind of
    thing; ``labels`` places every label when the figure is drawn."""

    def __init__(self, ax, ix, axis, lanes, max_labels, fast):
        self.ax, self.ix, self.axis, self.lanes = ax, ix, axis, lanes
        self.x, self.row, self.span = axis.x, lanes.row, axis.span
        self.t1, self.max_labels, self.fast = axis.t1, max_labels, fast   # t1: the axis' end
        self.used = set()        # the legend's keys
        self.stuck_hatched = False   # stuck waits drawn hatched in crimson (the legend says so)
        self.said = []           # what was aggregated, how many of each: written under the lanes
        self.labels = _LabelLayout(ax)   # every label is placed at draw time, none over another
        # Dense things (event ticks, many lock waits or holds) are painted into one raster
        # image at about one column per pixel; sparse ones are drawn as vector shapes.
        self.raster = np.zeros((5 * len(lanes.rows), _BINS, 4))     # 5 sub-rows per row

    def end_of(self, pid):
        """When process `pid`'s lane ends (as the time axis judges it)."""
        return _end_of(self.ix, pid, None, self.t1)

    def paint(self, r, subrows, x0, x1, color, share=False):
        """Colour the pixel columns covered by the spans [x0, x1] in sub-rows of row r; with
        `share`, each column as opaque as the share of its width the spans cover."""
        span, raster = self.span, self.raster
        if share:
            cover = _coverage(np.asarray(x0, dtype=float), np.asarray(x1, dtype=float),
                              span / _BINS, _BINS)
            rgba = np.tile(to_rgba(color), (_BINS, 1))
            rgba[:, 3] = np.clip(cover, 0.0, 1.0)
            band = raster[5 * r + subrows[0]:5 * r + subrows[1]]
            band[:, cover > 0] = rgba[cover > 0]
            return
        c0 = np.clip((np.asarray(x0) / span * _BINS).astype(np.int64), 0, _BINS - 1)
        c1 = np.clip((np.asarray(x1) / span * _BINS).astype(np.int64), 0, _BINS - 1)
        cover = np.zeros(_BINS + 1, dtype=np.int64)      # +1 where a span starts, -1 after
        np.add.at(cover, c0, 1)
        np.add.at(cover, c1 + 1, -1)
        cols = np.cumsum(cover[:-1]) > 0
        raster[5 * r + subrows[0]:5 * r + subrows[1], cols] = to_rgba(color)

    def draw_lives(self):
        """Background bands, each process's life bar with how it ended, each thread's line."""
        ax, ix, x, labels, t1 = self.ax, self.ix, self.x, self.labels, self.t1
        bars, bar_colors, threads, kills = [], [], [], []
        for r, (kind, obj) in enumerate(self.lanes.rows):
            if kind == "process":
                p = obj
                end = p.exit_ns if p.exit_ns is not None else t1
                key = _ending(p)
                self.used.add(key)
                bars.append(Rectangle((x(p.start_ns), r - 0.22),
                                      max(x(end) - x(p.start_ns), 1e-9), 0.44))
                bar_colors.append(COLORS[key])
                if key == "signal" and p.exit_ns is not None:
                    kills.append(((x(end), r - 0.3), (x(end), r + 0.3)))
                # (never clipped: "SIGTERM" cut to "SIGTER" at the axes' edge would be a lie;
                # MIN_PX right of the end: past a last wait drawn MIN_PX wide there)
                if not self.fast:
                    labels.fixed.append(ax.annotate(
                        " " + _ending_words(p), (x(end), r), xytext=(MIN_PX * 0.75, 0),
                        textcoords="offset points", va="center", ha="left", fontsize=7.5,
                        color=COLORS[key] if key != "exit0" else "#555555", clip_on=False))
            elif kind == "thread":
                p, tid = obj
                start = ix.first_seen.get((p.pid, tid), p.start_ns)
                end = ix.thread_end.get((p.pid, tid)) or p.exit_ns or t1
                threads.append((x(start), x(end), r, 0))
            if r and kind == "process":
                ax.axhline(r - 0.5, color="#dddddd", lw=0.8, zorder=0)
        # (a process that lived 5 ms on a 3 s axis is still drawn, MIN_PX wide)
        labels.widen(ax.add_collection(PatchCollection(bars, facecolors=bar_colors,
                                                       edgecolors="none", zorder=1,
                                                       gid="lives")),
                     [(b.get_x(), b.get_x() + b.get_width(), b.get_y(), b.get_height())
                      for b in bars])
        if kills:                # where it was killed: over the waits that hide its bar
            ax.add_collection(LineCollection(kills, colors=COLORS["signal"], linewidths=3.0,
                                             zorder=6, gid="kills"))
        if threads:              # a thread's line, from its first event to its end
            labels.widen(ax.add_collection(LineCollection(
                [((a, y), (b, y)) for a, b, y, _ in threads], colors="#999999", linewidths=1.0,
                zorder=1, gid="threads")), threads)

    def draw_lock_waits(self):
        """Lock waits, hatched (red where stuck for good), merged to pixel resolution; a short
        one is drawn at least MIN_PX pixels wide (at draw time, when the pixel size is known)."""
        ax, ix, x, row, span = self.ax, self.ix, self.x, self.row, self.span
        waits = defaultdict(list)                     # (row, stuck) -> [(x0, x1)]
        for lid, pid, tid, since, until in ix.waits:
            if (pid, tid) in self.lanes.folded:  # (a hatched process lane: its main thread waits)
                continue
            end = until or _end_of(ix, pid, None, self.t1)     # (as the time axis judges it)
            waits[(row(pid, tid), until is None and pid in self.lanes.dead)].append(
                (x(since), x(end)))
        for (r, stuck), spans in waits.items():
            color = COLORS["deadlock"] if stuck else COLORS["waiting"]
            merged = _merge(spans, 2 * span / _BINS)
            if len(merged) <= 60:
                self.stuck_hatched |= stuck
                boxes = [(a, b, r - 0.3, 0.6) for a, b in merged]
                self.labels.widen(ax.add_collection(PatchCollection(
                    _rects(boxes), facecolors="white", edgecolors=color, hatch="///",
                    linewidths=1.0, zorder=3, gid="lock waits")), boxes)
            else:                                     # too many to hatch: painted, pale
                self.paint(r, (1, 4), [m[0] for m in merged], [m[1] for m in merged],
                           to_rgba(color, 0.5))
            if not stuck:                             # (a stuck one is "stuck for good" in the key)
                self.used.add("waiting")
        _label_short_lock_waits(ax, ix, x, row, span, self.labels, self.max_labels)

    def draw_lock_holds(self):
        """Lock holds: a thin blue line under the holder's lane (painted when there are many)."""
        ix, x = self.ix, self.x
        holds = defaultdict(list)
        for lk in ix.lock_infos.values():
            for h in lk.holds:
                end = h.release_ns or _end_of(ix, h.pid, None, self.t1)
                holds[self.row(h.pid, h.tid)].append((x(h.acquire_ns), x(end)))
        if not holds:
            return
        merged = {r: _merge(spans, self.span / _BINS) for r, spans in holds.items()}
        if sum(map(len, merged.values())) <= 300:
            segs = [(a, b, r + 0.3, 0) for r, m in merged.items() for a, b in m]
            self.labels.widen(self.ax.add_collection(LineCollection(
                [((a, y), (b, y)) for a, b, y, _ in segs], colors=COLORS["holding"],
                linewidths=3, zorder=3, gid="lock holds")), segs)
            _label_short_holds(self.ax, ix, x, self.row, self.t1, self.span, self.labels,
                               self.max_labels)
        else:
            for r, m in merged.items():
                self.paint(r, (4, 5), [a for a, _ in m], [b for _, b in m], COLORS["holding"])
        self.used.add("holding")

    def draw_blocked(self):
        """Blocked in a recorded wait (join, q.join, a full pipe ...): each wait as a
        cross-hatched box on its thread's lane, labelled with what it waits on ("join producer
        (pid 12)"); a wait with no end lasts to its process's end. A short wait is drawn at least
        MIN_PX pixels wide, and then says how long it truly was. A folded helper thread's waits
        are not drawn (see ``_HELPER_THREAD``).

        Thousands of finished waits (a DataLoader's worker waits for each index) cannot be boxes:
        ten of them share a pixel column. Each column is then painted as dark as the share of its
        time the thread spent waiting -- never a box over the whole stretch, which would say it
        waited all along -- in a band over its lane, and the note under the lanes says how many
        waits were painted so. An unfinished wait is the story: it is always a box."""
        ax, ix, x, row, span, labels = self.ax, self.ix, self.x, self.row, self.span, self.labels
        runs = [w for w in _runs_of_waits(ix, self.t1) if (w[0], w[1]) not in self.lanes.folded]
        done = [w for w in runs if w[4]]
        if len(done) > _MANY_WAITS:
            per_row = defaultdict(list)
            for pid, tid, since, end, _, _, _ in done:
                per_row[row(pid, tid)].append((x(since), x(end)))
            for r, spans in per_row.items():
                self.paint(r, (0, 1), [a for a, _ in spans], [b for _, b in spans],
                           COLORS["blocked"], share=True)
            self.said.append(f"{sum(w[6] for w in done):,} waits painted as the share of each "
                             f"pixel column spent waiting (the band over a lane: darker = longer)")
            runs = [w for w in runs if not w[4]]
            self.used.add("blocked")
        boxes, texts, short = [], [], []
        for pid, tid, since, end, finished, words, n in runs:
            a, b, r = x(since), x(end), row(pid, tid)
            boxes.append((a, b, r - 0.26, 0.52))
            if n > 1:                 # a get(timeout=...) in a loop: one box, said how many
                words += f" ({n} waits in a row: it timed out and asked again {n - 1}×)"
            if not finished or b - a > 0.02 * span:   # an unfinished wait is the story: always
                texts.append((a, b, r, ("waited: " if finished else "waits: ") + words))
            else:
                short.append((a, b, r, f"waited {_duration(end - since)}"))
        if not boxes:
            return
        labels.widen(ax.add_collection(PatchCollection(
            _rects(boxes), facecolors=BLOCKED_FILL, edgecolors=COLORS["blocked"], hatch="xx",
            linewidths=0.8, zorder=2.5, gid="blocked")), boxes)
        self.used.add("blocked")
        if len(short) <= self.max_labels:    # its true length, where the box is drawn wider
            for a, b, r, text in short:
                _label_true_length(ax, labels, text, COLORS["blocked"], (a, b, r - 0.26, 0.52))
        else:
            labels.unsaid += len(short)
        if len(texts) <= self.max_labels:
            for a, b, r, text in texts:
                # on the box, from its start; a short box near the right edge: to its left, → it
                left = b - a < 0.12 * span and a > 0.6 * span
                labels.add(ax.annotate(text + " →" if left else text, (a, r),
                                       xytext=_LEFT_OF_SPAN[0] if left else _ON_SPAN[0],
                                       textcoords="offset points", fontsize=7,
                                       ha="right" if left else "left", va="center",
                                       color=COLORS["blocked"], zorder=7,
                                       bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none",
                                                 alpha=0.8)),
                           1, _LEFT_OF_SPAN if left else _ON_SPAN, own=(a, b, r - 0.26, 0.52))
        else:
            labels.unsaid += len(texts)

    def draw_collectives(self, trace):
        """torch.distributed: each rank's collectives, joined at the last arrival."""
        collectives.draw(self.ax, trace, self.x, self.lanes.proc_row, self.t1, self.span,
                         self.labels, self.used, self.max_labels, self.end_of, self.said)

    def draw_tasks(self):
        """Pool tasks: white boxes on the worker's lane; one that raised, pink with an ✕."""
        ax, ix, x, row = self.ax, self.ix, self.x, self.row
        tasks = [(x(a), x(b), row(pid, tid) - 0.18, 0.36) for pid, tid, a, b in ix.tasks]
        if tasks:
            self.labels.widen(ax.add_collection(PatchCollection(
                _rects(tasks), facecolors="white", edgecolors="#333333", linewidths=0.8,
                zorder=2, gid="tasks")), tasks if len(tasks) <= 2000 else None,
                unlabelled="Pool tasks")
            self.used.add("task")
        # a task that raised: pink over its white box, at least a few pixels wide, and an ✕ at
        # its end (a task that fails at once would be a hairline)
        failed = [Rectangle((x(a), row(pid, tid) - 0.18), max(x(b) - x(a), self.span / 200), 0.36)
                  for pid, tid, a, b in ix.failed_tasks]
        if failed:
            ax.add_collection(PatchCollection(failed, facecolors=COLORS["task_failed"],
                                              edgecolors=COLORS["exitcode"], linewidths=1.2,
                                              zorder=2))
            ax.scatter([x(b) for _, _, _, b in ix.failed_tasks],
                       [row(pid, tid) - 0.3 for pid, tid, _, _ in ix.failed_tasks], marker="x",
                       s=30, color=COLORS["exitcode"], linewidths=1.5, zorder=6)
            self.used.add("task_failed")

    def draw_ticks(self):
        """Event ticks, binned to pixel columns, painted; then the raster image of all painted."""
        axis = self.axis
        for who, stamps in self.ix.ticks.items():
            xs = np.interp(np.asarray(stamps, dtype=float), axis.real, axis.disp)
            self.paint(self.row(*who), (1, 4), xs, xs, COLORS["event"])
            self.used.add("event")
        if self.raster[..., 3].any():
            n = len(self.lanes.rows)
            self.ax.imshow(self.raster, extent=(0, self.span, n - 0.5, -0.5), aspect="auto",
                           interpolation="nearest", zorder=4)

    def draw_marks(self):
        """The program's marks (``mpviz.trace.mark``): a tick on the lane, its name below it."""
        ax, x, row, span = self.ax, self.x, self.row, self.span
        marks = [e for e in self.ix.by_kind.get("mark", ())
                 if not e.args.get("failed")]      # (a failed one is drawn as an ✗)
        if not marks:
            return
        mx = np.array([x(e.ts_ns) for e in marks])
        my = np.array([row(e.pid, e.tid) for e in marks])
        if len(marks) > _BINS:
            keep = np.unique(np.stack([my, (mx / span * _BINS).astype(int)]), axis=1,
                             return_index=True)[1]
            mx, my = mx[keep], my[keep]
            self.said.append(f"{len(marks):,} marks drawn as {len(mx):,} ticks (one per pixel "
                             f"column)")
        ax.scatter(mx, my, marker="|", s=90, color=COLORS["mark"], zorder=5, linewidths=1.5,
                   gid="marks")
        if len(marks) <= self.max_labels:
            for e in marks:
                name = str(e.args.get("name", ""))
                self.labels.add(ax.annotate(name, (x(e.ts_ns), row(e.pid, e.tid)),
                                            xytext=(0, -11), textcoords="offset points",
                                            fontsize=7, ha="center", va="top",
                                            color=COLORS["mark"], zorder=7,
                                            bbox=dict(boxstyle="square,pad=0.05", fc="white",
                                                      ec="none", alpha=0.7)),
                                4 if name.startswith("scenario.") else 2, _BELOW)
        self.used.add("mark")

    def draw_copies(self):
        """Copies into shared memory: red squares sized by bytes, labelled in groups."""
        ax, x, row, span, labels = self.ax, self.x, self.row, self.span, self.labels
        copies = self.ix.by_kind.get("copy", ())
        if not copies:
            return
        cx = np.array([x(e.ts_ns) for e in copies])
        cy = np.array([row(e.pid, e.tid) for e in copies])
        sizes = np.array([e.args.get("nbytes") or 0 for e in copies], dtype=float)
        if len(copies) > _BINS:                   # one square per pixel column and row
            keys, inverse = np.unique(cy * _BINS + (cx / span * _BINS).astype(np.int64),
                                      return_inverse=True)
            total = np.zeros(len(keys))
            np.add.at(total, inverse, sizes)
            cx = ((keys % _BINS) + 0.5) * span / _BINS
            cy, sizes = keys // _BINS, total
            self.said.append(f"{len(copies):,} copies drawn as {len(keys):,} squares (one per "
                             f"pixel column, sized by their bytes)")
        area = 20 + 180 * np.sqrt(sizes / max(sizes.max(), 1.0))
        labels.marks += [(a, b, math.sqrt(s) / 2) for a, b, s in zip(cx, cy, area)]
        ax.scatter(cx, cy, s=area,
                   marker="s", color=COLORS["copy"], edgecolors="white", linewidths=0.5,
                   zorder=6)
        groups = _clusters([(x(e.ts_ns), row(e.pid, e.tid), e.args.get("nbytes") or 0)
                            for e in copies], span, gap=0.12) \
            if len(copies) <= 20 * self.max_labels else ()
        if 0 < len(groups) <= self.max_labels:
            for g in groups:
                total = sum(i[2] for i in g)
                text = (f"copy {human_bytes(total)}" if len(g) == 1 else
                        f"{len(g)} copies, {human_bytes(total)}")
                labels.add(ax.annotate(text, (sum(i[0] for i in g) / len(g), g[0][1]),
                                       xytext=(0, 9), textcoords="offset points", fontsize=7,
                                       ha="center", va="bottom", color=COLORS["copy"],
                                       zorder=7, bbox=dict(boxstyle="square,pad=0.05",
                                                           fc="white", ec="none", alpha=0.8)),
                           0, _ABOVE)
        self.used.add("copy")

    def draw_messages(self, max_arrows):
        """Messages: an arrow put → get (bundled above `max_arrows`), fds passed, ▸ never got.
        A request for an fd (torch's, to the sender's ``_serve``) is drawn as a message, though
        the trace has it from the hand-over (``analysis.fd_requests``), not as one."""
        ax, ix, x, row, span = self.ax, self.ix, self.x, self.row, self.span
        flows = [f for f in ix.flows if f.get is not None]
        lost = [f for f in ix.flows if f.get is None]
        if len(flows) + len(ix.fd_requests) <= max_arrows:
            self._draw_arrows(flows + ix.fd_requests)
        else:
            for drawn, what in ((flows, "messages"), (ix.fd_requests, "requests for an fd")):
                if drawn:
                    _bundled_arrows(ax, drawn, ix.handles, self.axis, row, span, self.used,
                                    self.said, what)
        self.labels.lines += _draw_fd_passes(ax, ix, x, row, span, max_arrows, self.used,
                                             self.said)
        for f in lost:
            ax.plot([x(f.put.ts_ns)], [row(f.put.pid, f.put.tid)], marker=">", ms=6,
                    color=COLORS["message"], zorder=6)
        if lost:
            self.labels.note = f"{len(lost)} message{'s' * (len(lost) > 1)} never got (▸)"
            self.used.add("lost")

    def _draw_arrows(self, flows):
        """One arrow per message, as thick as its bytes, labelled with them in groups."""
        ax, x, row, labels, handles = self.ax, self.x, self.row, self.labels, self.ix.handles
        arrow_labels = []
        for f in flows:
            key = _message_kind(f, handles)
            self.used.add(key)
            n = f.nbytes or 0
            lw = min(4.0, 0.7 + 0.55 * math.log10(max(n, 10) / 10))
            a = (x(f.put.ts_ns), row(f.put.pid, f.put.tid))
            b = (x(f.get.ts_ns), row(f.get.pid, f.get.tid))
            ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=9, lw=lw,
                                         color=COLORS[key], alpha=0.85, zorder=5,
                                         shrinkA=0, shrinkB=2))
            labels.lines.append((a, b))
            arrow_labels.append((a[0] + 0.35 * (b[0] - a[0]), (a[1], b[1], key),
                                 (a[1] + 0.35 * (b[1] - a[1]), n)))
        groups = _clusters(arrow_labels, self.span)
        if len(groups) > self.max_labels:
            return
        rank = {"copy": 0, "handle": 1, "message": 3, "fd_request": 3}   # the lesson first
        for g in groups:
            sizes = sorted({i[2][1] for i in g})
            each = human_bytes(sizes[0]) if len(sizes) == 1 else \
                f"{human_bytes(sizes[0])}–{human_bytes(sizes[-1])}"
            text = each if len(g) == 1 else f"{len(g)}× {each}"
            labels.add(ax.annotate(text, (g[0][0], g[0][2][0]), xytext=(0, 0),
                                   textcoords="offset points", fontsize=6.5, ha="center",
                                   va="center", color=COLORS[g[0][1][2]], zorder=6,
                                   bbox=dict(boxstyle="round,pad=0.1", fc="white",
                                             ec="none", alpha=0.85)),
                       rank[g[0][1][2]] + 0.5 / len(g), _ON_ARROW)

    def draw_failures(self):
        """Actions that failed: a magenta ✗ on the lane, and what failed beside it."""
        ax, x, row, labels = self.ax, self.x, self.row, self.labels
        for fail in self.ix.failures:
            where = (x(fail.ts_ns), row(fail.pid, fail.tid))
            labels.marks.append((where[0], where[1], 5))
            ax.plot([where[0]], [where[1]], marker="X", ms=10, color=COLORS["failed"],
                    markeredgecolor="white", markeredgewidth=0.8, zorder=8)
            labels.add(ax.annotate("✗ " + fail.what, where, xytext=_BESIDE_MARK[0],
                                   textcoords="offset points", fontsize=7, ha="left",
                                   va="center", color=COLORS["failed"], fontweight="bold",
                                   zorder=8, bbox=dict(boxstyle="square,pad=0.1", fc="white",
                                                       ec="none", alpha=0.85)),
                       -1, _BESIDE_MARK)
            self.used.add("failed")

    def draw_stuck(self):
        """Each process stuck for good: a red box round its rows, with the reason inside."""
        ax, rows, span = self.ax, self.lanes.rows, self.span
        for pid, d in self.lanes.dead.items():
            r = self.lanes.proc_row.get(pid)
            if r is None:
                continue
            first = r + 1
            while first < len(rows) and rows[first][0] != "reason":
                first += 1
            last = first
            while last + 1 < len(rows) and rows[last + 1] == ("reason", rows[first][1]):
                last += 1
            box = ax.add_patch(Rectangle((-0.005 * span, r - 0.45), span * 1.01, last - r + 0.9,
                                         fill=False, edgecolor=COLORS["deadlock"], lw=2.0,
                                         zorder=7, gid="stuck box"))
            # from the top of its rows, wrapped to the box's width when drawn (labels.stuck)
            text = ax.annotate(_stuck_words(d), (-0.005 * span, first - 0.5), xytext=(7, -2),
                               textcoords="offset points", fontsize=_STUCK_FONT,
                               color=COLORS["deadlock"], va="top", ha="left", zorder=8,
                               gid="stuck text")
            text.set_in_layout(False)             # (wrapped inside its box when drawn)
            self.labels.stuck.append((text, _stuck_words(d), box))
            self.labels.fixed.append(text)
            self.used.add("deadlock")

    def draw_cuda_warnings(self):
        """A CUDA warning: an amber ▼ (a warning, not a deadlock)."""
        ax, x, row = self.ax, self.x, self.row
        for e in self.ix.by_kind.get("cuda.warning", ()):
            self.labels.marks.append((x(e.ts_ns), row(e.pid, e.tid), 5))
            ax.plot([x(e.ts_ns)], [row(e.pid, e.tid)], marker="v", ms=10,
                    color=COLORS["warning"], markeredgecolor="#7a5200", markeredgewidth=0.8,
                    zorder=8)
            self.labels.add(ax.annotate("warning", (x(e.ts_ns), row(e.pid, e.tid)),
                                        xytext=(0, 9), textcoords="offset points", fontsize=7,
                                        ha="center", va="bottom", color="#7a5200",
                                        fontweight="bold", zorder=8),
                            0, _ABOVE)
            self.used.add("warning")

    def name_lanes(self, at, title, left_out):
        """The lanes' names (a stuck process's in red), the axes' limits, time ticks, title."""
        ax, ix, rows, span = self.ax, self.ix, self.lanes.rows, self.span
        names = []
        for kind, obj in rows:
            if kind == "process":
                p = obj
                how = f" · {p.how}" if p.how not in (None, "record") else ""
                name = ix.labels[p.pid]
                names.append(f"{name}{how}" if name == f"pid {p.pid}" else
                             f"{name}\npid {p.pid}{how}")
            elif kind == "thread":
                p, tid = obj
                names.append(f"└ {ix.thread_name(p.pid, tid)}")
            else:
                names.append("")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(names, fontsize=8)
        for tick, (kind, obj) in zip(ax.get_yticklabels(), rows):
            if kind == "process" and obj.pid in self.lanes.dead:
                tick.set_color(COLORS["deadlock"])
                tick.set_fontweight("bold")
            elif kind == "thread":
                tick.set_fontsize(7)
                tick.set_color("#555555")
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(-0.01 * span, span * 1.08)
        self.axis.decorate(ax, self.fast)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="y", length=0)
        if at is not None:
            ax.axvline(self.x(at), color="#000000", lw=1.2, ls="--", zorder=9)
        if not self.fast or title or left_out:
            ax.set_title("\n".join(filter(None, [
                title or "What each process did, and what travelled between them", left_out])),
                loc="left", fontsize=10)

    def legend_and_notes(self, fig, owned, notes):
        """The legend of what was drawn, what was aggregated, and the trace's `notes`, below."""
        ax, folded, said = self.ax, self.lanes.folded, self.said
        if folded:
            said.append(f"{len(folded)} helper thread{'s' * (len(folded) > 1)} (Pool handlers, "
                        f"Queue feeders, fd servers, a Manager's connections) drawn on their process's lane")
        note = _wrap(" · ".join(said), 160) if said else ""
        if not self.fast:
            keys = [k for k in _LEGEND_ORDER if k in self.used]
            _legend_below(ax, keys, bool(self.axis.gaps), note, self.stuck_hatched)
            if owned:                  # room for the legend's rows, the lanes keep their height
                fig.set_figheight(fig.get_figheight() + 0.2 * _legend_rows(keys) + 0.2 +
                                  0.15 * (note.count("\n") + 1 if note else 0))
        elif note:
            ax.text(0.0, -0.02, note, transform=ax.transAxes, fontsize=7.5, va="top", ha="left",
                    color="#555555", gid="aggregated")
        if owned and not self.fast:           # (in viz.plot's figure, plot writes them once)
            from . import notes_under
            notes_under(fig, notes)


_LEGEND_ORDER = ["handle", "fd", "copy", "message", "fd_request", "lost", "failed",
                 "collective", "collective_wait", "disagree", "blocked", "waiting", "holding",
                 "deadlock", "warning", "task", "task_failed", "exit0", "exitcode", "signal",
                 "running", "mark", "event"]


# --- labels that never overlap -------------------------------------------------------------

# Where a label may go, in points from its anchor, tried in order: its own place first, then
# rows further out, then the other side of the lane (a lane is about 40 points high). A third
# item, +1 or -1, moves a centred label wholly to the right (left) of its anchor: where an
# arrow starts at a mark, the mark's name beside it rather than across the arrow.
_BELOW = ((0, -11), (0, -11, 1), (0, -11, -1), (0, -19), (0, 19), (0, 11))
_ABOVE = ((0, 9), (0, 9, 1), (0, 9, -1), (0, 17), (0, -19), (0, -11))
_ON_ARROW = ((0, 0), (0, 8), (0, -8), (0, 15), (0, -15))
_ON_SPAN = ((3, 0), (14, 0), (3, 10), (3, -10), (14, 10), (14, -10), (3, 18), (3, -18))
_LEFT_OF_SPAN = ((-3, 0), (-3, 10), (-3, -10), (-3, 18), (-3, -18))
_BESIDE_MARK = ((8, 0), (-4, 13), (-4, -13), (-4, 20), (-4, -20))
_RIGHT_OF_SHORT = ((6, 0), (6, 9), (6, -9), (6, 17), (6, -17))
_HOLD = ((6, 0), (6, 8), (6, -8), (6, 15))

MIN_PX = 3           # a wait, a hold, a task is never drawn narrower than this many pixels
_STUCK_FONT = 7.5


class _LabelLayout(Artist):
    """Places the timeline's labels when the figure is drawn, when their real sizes are known.

    Drawn first (lowest zorder), before the things it arranges, it does three jobs that need
    the renderer's pixels:

    * short spans (``widen``): a lock hold of 2 ms on a 3 s axis is narrower than a pixel and
      would vanish; it is drawn MIN_PX pixels wide. Its label says its true length ("held lock
      'L' 2.0 ms"), shown only where the drawn width says more than the truth (``short=``); a
      hold over a fork is always labelled, since the fork is the lesson.
    * the "STUCK FOR GOOD" explanations (``stuck``): wrapped to their red box's real width,
      measured word by word; a smaller font only if the box's rows cannot hold it.
    * labels (``add``), most important first: each goes to the first of its places
      (``_BELOW``...) whose box overlaps no label already placed, stays inside the axes and
      covers no drawn box or square but its own span's (a label over another wait box reads
      as that box's name; over a Pool task, as if the worker waited in it); among free places
      one that crosses fewer arrows wins. A label with no free place is
      hidden, and "+N labels hidden" says how many.
    """

    def __init__(self, ax):
        super().__init__()
        self.items, self.fixed, self.note = [], [], ""
        self.spans, self.stuck, self.lines = [], [], []
        self.marks = []                       # squares and ✗: (x, y, half size in points)
        self.unsaid = 0                       # labels not even tried: too many of their kind
        self.set_zorder(-100)
        self.more = ax.text(1.0, 1.0, "", transform=ax.transAxes, ha="right", va="bottom",
                            fontsize=7.5)         # notes over the top right corner
        ax.add_artist(self)

    def add(self, annotation, priority, places, short=None, own=None):
        """`short`: the true width (data units) of the span the label is for: the label is
        written only where the span is drawn wider than that (MIN_PX). `own`: that span
        (x0, x1, y, height), which the label may cover; a label on a long span may also cover
        what its span lies on (a Pool task the wait happened in), a short one's may not."""
        annotation.set_in_layout(False)       # kept inside the axes here, when drawn
        self.items.append((priority, len(self.items), annotation, places, short, own,
                           annotation.get_text()))

    def widen(self, collection, spans, unlabelled=None):
        """`spans` [(x0, x1, y, height)] drawn by `collection` (rectangles; lines when the
        height is 0), to redraw at least MIN_PX pixels wide. None: too many, left as they are.
        `unlabelled`: what they are, when no label says their true length: a note then says
        how many were drawn wider than they lasted."""
        if spans is not None:
            self.spans.append((collection, spans, unlabelled))

    def draw(self, renderer):
        ax = self.axes
        frame = ax.get_window_extent(renderer)
        lo, hi = ax.get_xlim()
        least = MIN_PX * (hi - lo) / max(frame.width, 1.0)   # MIN_PX, in data units
        widened = []
        for collection, spans, unlabelled in self.spans:
            _redraw_wider(collection, spans, least)
            n = sum(1 for a, b, _, _ in spans if b - a < least / 2)
            if n and unlabelled:
                widened.append(f"{n} {unlabelled} shorter than {MIN_PX} px drawn {MIN_PX} px "
                               f"wide")
        for text, words, box in self.stuck:
            _fit_in_box(text, words, box.get_window_extent(renderer), renderer)
        boxes, keys = self._obstacles(renderer, least)
        taken = [t.get_window_extent(renderer) for t in self.fixed if t.get_visible()]
        taken = [b for b in taken if b.width > 0]
        lines = [ax.transData.transform(seg) for seg in self.lines]
        hidden = 0
        for _, _, text, places, short, own, words in sorted(self.items, key=lambda i: i[:2]):
            if short is not None and short >= least / 2:
                text.set_visible(False)         # drawn about as wide as it was: no need
                continue
            text.set_visible(True)
            mine = np.zeros(len(boxes), dtype=bool)       # the boxes it may cover
            if own is not None and len(boxes):
                at = keys.index(own) if own in keys else None
                if at is not None:
                    mine[at] = True
                    if short is None:                     # and what its span lies on
                        o = boxes[at]
                        mine |= ((boxes[:, 0] <= o[0] + 1) & (boxes[:, 2] >= o[2] - 1) &
                                 (boxes[:, 1] <= o[1] + 1) & (boxes[:, 3] >= o[3] - 1))
            best = self._best_place(text, words, places, own, boxes[~mine], taken, lines,
                                    renderer)
            if best is None:
                text.set_visible(False)
                hidden += 1
            else:
                text.xyann = best[1]
                text.set_text(best[3])
                taken.append(best[2])
        notes = ([self.note] if self.note else []) + widened
        if hidden:
            notes.append(f"+{hidden} label{'s' * (hidden > 1)} hidden (no free room)")
        if self.unsaid:
            notes.append(f"{self.unsaid} more labels not written: too many of their kind")
        self._write_notes(notes, renderer)

    def _best_place(self, text, words, places, own, others, taken, lines, renderer):
        """The first of `places` where `text` stays near its anchor, inside the axes, over no
        label `taken` and no box of `others`, crossing the fewest `lines`: (crossed, offset,
        box, words), or None where there is no such place."""
        ax = self.axes
        frame = ax.get_window_extent(renderer)
        # inside the axes by a few points: a label pushed flush against the left edge would
        # sit on a STUCK box's border (drawn just inside it) and its first glyph be lost there
        pad = 6 * renderer.dpi / 72
        left, right = frame.x0 + pad, frame.x1 - pad
        best = None
        for dx, dy, *side in places + self._off_span(own, places, renderer):
            # a span's name written wholly before its start points at it
            before = side and side[0] < 0 and own is not None and not words.endswith("→")
            text.set_text(words + " →" if before else words)
            text.xyann = (dx, dy)
            box = text.get_window_extent(renderer)
            if side:                       # beside its anchor, 4 points off
                at = ax.transData.transform(text.xy)[0] + side[0] * 4 * renderer.dpi / 72
                move = at - box.x0 if side[0] > 0 else at - box.x1
                text.xyann = (dx + move * 72 / renderer.dpi, dy)
                box = text.get_window_extent(renderer)
            shift = max(0.0, left - box.x0) - max(0.0, box.x1 - right)
            if shift:                      # keep it inside the axes, left to right
                text.xyann = (text.xyann[0] + shift * 72 / renderer.dpi, dy)
                box = text.get_window_extent(renderer)
            if not _near(box, ax.transData.transform(text.xy), renderer):
                continue                   # pushed away from what it names
            if box.y0 < frame.y0 + 2 or box.y1 > frame.y1 - 2 or box.x0 < frame.x0 - 1:
                continue       # out of the picture (or wider than it; its white pad too)
            padded = box.padded(2)
            if any(padded.overlaps(b) for b in taken):
                continue
            if np.any((others[:, 0] < box.x1) & (others[:, 2] > box.x0) &
                      (others[:, 1] < box.y1) & (others[:, 3] > box.y0)):
                continue                   # over another box, a copy's square, a ✗
            crossed = sum(_crosses(seg, padded) for seg in lines)
            if best is None or crossed < best[0]:
                best = (crossed, text.xyann, box, text.get_text())
            if not crossed:
                break
        return best

    def _write_notes(self, notes, renderer):
        """The notes over the top right corner, on one line where that fits beside the title
        (the layout kept one line's room there: more lines would run out of the figure)."""
        self.more.set_text(" · ".join(notes))
        title = self.axes._left_title
        room = self.axes.get_window_extent(renderer).x1 - (
            title.get_window_extent(renderer).x1 + 12 if title.get_text() else 0)
        if len(notes) > 1 and self.more.get_window_extent(renderer).width > room:
            self.more.set_text("\n".join(notes))

    def _off_span(self, own, places, renderer):
        """More places for a span's label, when its own are taken: just over and just under
        the span (however tall its lane is drawn), and wholly to the left of its start."""
        if own is None:
            return ()
        ax = self.axes
        a, _, y, h = own
        (_, y0), (_, y1) = ax.transData.transform([(a, y), (a, y + h)])
        half = abs(y1 - y0) / 2 * 72 / renderer.dpi + 6      # points, from the lane's middle
        dx = places[0][0]
        return ((dx, half), (dx, -half), (0, 0, -1), (0, half, -1), (0, -half, -1))

    def _obstacles(self, renderer, least):
        """The drawn boxes and squares no label may cover, in pixels: an array of rows
        (x0, y0, x1, y1), and for each the span it was given as (None for a square)."""
        ax, rows, keys = self.axes, [], []
        for collection, spans, _ in self.spans:
            if collection.get_gid() not in ("blocked", "lock waits", "tasks"):
                continue
            for a, b, y, h in spans:
                (x0, y0), (x1, y1) = ax.transData.transform([(a, y), (max(b, a + least), y + h)])
                rows.append((min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)))
                keys.append((a, b, y, h))
        per_point = renderer.dpi / 72
        for mx, my, half in self.marks:
            px, py = ax.transData.transform((mx, my))
            d = half * per_point
            rows.append((px - d, py - d, px + d, py + d))
            keys.append(None)
        return np.array(rows, dtype=float).reshape(-1, 4), keys


def _near(box, anchor, renderer):
    """Whether a label's box (pixels) still touches, or nearly, the point it names: a label
    pushed along its row to stay in the picture must not end up beside something else."""
    reach = 16 * renderer.dpi / 72
    return box.x0 - reach <= anchor[0] <= box.x1 + reach


def _rects(spans):
    return [Rectangle((a, y), max(b - a, 1e-9), h) for a, b, y, h in spans]


def _redraw_wider(collection, spans, least):
    """Each span from its true start, at least `least` wide (its end is what gets widened)."""
    if isinstance(collection, LineCollection):
        collection.set_segments([((a, y), (max(b, a + least), y)) for a, b, y, _ in spans])
    else:
        collection.set_paths([Rectangle((a, y), max(b - a, least), h) for a, b, y, h in spans])


def _crosses(seg, box):
    """Whether the straight line seg ((x0, y0), (x1, y1)), in pixels, passes through box."""
    return Path(seg).intersects_bbox(box, filled=False) or box.contains(*seg[0]) \
        or box.contains(*seg[1])


def _measure(renderer, fontprops):
    def width(s):
        return renderer.get_text_width_height_descent(s, fontprops, ismath=False)[0]
    return width


def _wrap_to(words, room, width):
    """`words` wrapped greedily so that every line is at most `room` wide by `width`(line)."""
    lines = []
    for word in words.split():
        if lines and width(lines[-1] + " " + word) <= room:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def _fit_in_box(text, words, box, renderer):
    """Wrap `text` to the inside of `box` (pixels), from where it starts; smaller type only if
    its lines would run out of the box's bottom."""
    x0 = text.get_window_extent(renderer).x0
    inset = 7 * renderer.dpi / 72
    room = box.x1 - inset - x0
    for size in (_STUCK_FONT, 7, 6.5, 6, 5.5):
        text.set_fontsize(size)
        text.set_text(_wrap_to(words, room, _measure(renderer, text.get_fontproperties())))
        if text.get_window_extent(renderer).y0 >= box.y0 + 2:
            return


def _stuck_words(dead):
    return "STUCK FOR GOOD: " + dead.reason


def _reason_rows(words, ax):
    """How many lane rows a STUCK explanation needs (it is wrapped to the box's width when
    drawn; here that width is judged, a little narrow, from the figure's width)."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties
    if ax is None:
        room = (WIDTH - 1.8) * 72                       # points: lane names take ~1.8 inch
        row = 0.55 * 72
    else:
        extent = ax.get_window_extent()
        room = 0.85 * extent.width * 72 / ax.figure.dpi
        row = 0.55 * 72 * 0.7
    measure = _measure(RendererAgg(1, 1, 72), FontProperties(size=_STUCK_FONT))
    lines = _wrap_to(words, room, measure).count("\n") + 1
    return max(1, math.ceil((lines * 1.2 * _STUCK_FONT + 6) / (0.95 * row)))


def _label_short_holds(ax, ix, x, row, t1, span, labels, max_labels):
    """Each lock hold too short to see says how long it was ("held lock 'L' 2.4 ms"), and,
    when its process forked meanwhile, that too: a lock held by one thread while another
    forks is copied locked into the child, which is the fork lesson."""
    holds = [(lk.id, h) for lk in ix.lock_infos.values() for h in lk.holds]
    short = []
    for lid, h in holds:
        end = h.release_ns or _end_of(ix, h.pid, None, t1)
        forks = [c for c, (pid, _, ts) in ix.forker.items() if pid == h.pid and
                 h.acquire_ns <= ts <= end and getattr(ix.procs.get(c), "how", None) == "fork"]
        if x(end) - x(h.acquire_ns) < 0.02 * span or forks:
            short.append((lid, h, end, forks))
    if len(short) > max_labels:
        labels.unsaid += len(short)
        return
    for lid, h, end, forks in short:
        words = f"held {ix.lock_name(lid)} {_duration(end - h.acquire_ns)}"
        if forks:
            words += ", over the fork of " + ", ".join(
                f"{ix.labels.get(c, 'a child')} (pid {c})" for c in forks)
        labels.add(ax.annotate(words, (x(h.acquire_ns), row(h.pid, h.tid) + 0.3),
                               xytext=_HOLD[0], textcoords="offset points", fontsize=7,
                               ha="left", va="center", color=COLORS["holding"], zorder=7,
                               bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none",
                                         alpha=0.85)),
                   0.5 if forks else 2.5, _HOLD,
                   short=None if forks else x(end) - x(h.acquire_ns))


def _label_short_lock_waits(ax, ix, x, row, span, labels, max_labels):
    """A lock wait too short to see, drawn MIN_PX wide, says how long it truly waited."""
    short = [(pid, tid, since, until) for _, pid, tid, since, until in ix.waits
             if until is not None and x(until) - x(since) < 0.02 * span]
    if len(short) > max_labels:
        labels.unsaid += len(short)
        return
    for pid, tid, since, until in short:
        _label_true_length(ax, labels, f"waited {_duration(until - since)}", COLORS["waiting"],
                           (x(since), x(until), row(pid, tid) - 0.3, 0.6))


def _label_true_length(ax, labels, words, color, own):
    """A short span's true length, right of its start; written only where the span (x0, x1,
    y, height) is drawn wider than it lasted."""
    a, b, y, h = own
    labels.add(ax.annotate(words, (a, y + h / 2), xytext=_RIGHT_OF_SHORT[0],
                           textcoords="offset points", fontsize=6.5, ha="left", va="center",
                           color=color, zorder=7, bbox=dict(boxstyle="square,pad=0.1",
                                                            fc="white", ec="none", alpha=0.8)),
               3.5, _RIGHT_OF_SHORT, short=b - a, own=own)


def _legend_rows(keys):
    return math.ceil(len(keys) / 2)


def _legend_below(ax, keys, gaps, note="", stuck_hatch=False):
    """The legend in two columns under the time axis: the lanes get the figure's width (a
    notebook is about 1000 pixels wide). `note`: what was aggregated, written between the
    axis' name and the legend."""
    from matplotlib.transforms import blended_transform_factory, offset_copy
    below = 44 if gaps else 36              # points: past the tick labels and the axis' name
    if note:
        where = blended_transform_factory(
            offset_copy(ax.figure.transSubfigure, fig=ax.figure, x=4, units="points"),
            offset_copy(ax.transAxes, fig=ax.figure, y=-below, units="points"))
        ax.text(0.0, 0.0, note, transform=where, fontsize=7.5, va="top", ha="left",
                color="#555555", gid="aggregated")
        below += 10 * (note.count("\n") + 1) + 4
    # from the figure's left edge (under the lane names too), below the axes' bottom
    where = blended_transform_factory(
        offset_copy(ax.figure.transSubfigure, fig=ax.figure, x=4, units="points"),
        offset_copy(ax.transAxes, fig=ax.figure, y=-below, units="points"))
    legend(ax, keys, stuck_hatch, loc="upper left", bbox_to_anchor=(0.0, 0.0),
           bbox_transform=where,
           ncols=2, fontsize=7.5, columnspacing=1.5, handlelength=1.6)


# --- helpers --------------------------------------------------------------------------------

MAX_PROCESS_LANES = 40   # more lanes (threads' too): the telling processes, then the first


def _fewer_lanes(trace, ix):
    """`trace` with at most MAX_PROCESS_LANES processes, its index, in words what was left
    out (None: nothing), its ``st.deadlocks`` (None where lanes were left out), and its
    ``_thread_lanes`` (judged once, on the whole trace: of a process kept, its threads keep
    the lanes they had). A program that starts a thousand workers would get a picture metres tall
    that takes minutes to draw, in which nobody finds the one that failed. So every process that
    tells something is kept -- stuck, killed, failed, still running, or started by nobody
    recorded (the program's own) -- and then the first to start, up to the limit; the others'
    events (their messages too) are left out of the picture, and the title says how many."""
    procs = [p for p in ix.procs.values() if p.pid not in ix.watchdogs]
    deadlocks = st.deadlocks(trace)
    lanes = defaultdict(lambda: 1)                 # pid -> its lanes: its own and its threads'
    own, folded = _thread_lanes(ix, deadlocks)
    for pid, _ in own:
        lanes[pid] += 1
    if sum(lanes[p.pid] for p in procs) <= MAX_PROCESS_LANES:
        return trace, ix, None, deadlocks, (own, folded)
    stuck = {d.pid for d in deadlocks}

    def telling(p):
        return (p.pid in stuck or p.signal or p.exitcode not in (0, None) or p.exit_ns is None
                or p.ppid not in ix.procs)

    first, used = [], 0                            # the 40-lane cap counts thread lanes too
    for p in sorted(procs, key=lambda p: (not telling(p), p.start_ns)):
        if used + lanes[p.pid] <= MAX_PROCESS_LANES or not first:
            first.append(p)
            used += lanes[p.pid]
    keep = {p.pid for p in first} | set(ix.watchdogs)
    hidden = [p for p in procs if p.pid not in keep]
    # a message between a lane drawn and one left out goes too: its put alone would be drawn
    # as "put and never got" (▸), and it was got
    crossing = {f.put.args.get("msg") for f in ix.flows
                if f.get is not None and (f.put.pid in keep) != (f.get.pid in keep)}
    shown = trace.subset(lambda e: e.pid in keep and not (
        e.kind in ("process.launch", "process.reaped") and e.args.get("child") not in keep)
        and not (e.args.get("msg") in crossing and e.args.get("msg") is not None))
    odd = sum(1 for p in hidden if telling(p))
    how = (f"{odd} of them did not end normally" if odd else "all ended normally")
    words = (f"{len(procs)} processes: {len(first)} drawn (every one stuck, killed, failed or "
             f"unended, and the program's own; then the first to start); {len(hidden)} more "
             f"left out with their messages ({how}). All are in the trace: viz.summary, or "
             f"Perfetto (trace.to_chrome(path))")
    kept = ({w for w in own if w[0] in keep}, {w for w in folded if w[0] in keep})
    return shown, st._index(shown), _wrap(words, 110), None, kept


# Threads that multiprocessing and torch start for their own work: a Pool's three handlers, a
# Queue's feeder, resource_sharer's fd server (mpviz's: mpviz-fd-peer), the DataLoader's
# pin-memory thread. A DataLoader with 8 workers has 24 of them; a lane each would bury the
# processes. So a Pool's handlers are always drawn on their process's lane, and the others too
# when the picture would have more than _FOLD_ABOVE lanes (in a small picture a feeder's lane
# is a lesson: it writes a big item into the pipe after put returned). Their events stay on the
# picture, on their process's lane (a message their process sent, an fd it handed over); their
# waits do not (a hatched process lane says its main thread waits) -- unless the thread is the
# story: stuck, still waiting when the trace ends, waited for by a wait that never ended (a
# feeder its process joins at exit), or the one where something failed. Then it keeps its lane.
# A Manager's server process runs one handle_request thread per connection (each client
# process, each proxy): folded always too, in a Manager's server process.
_POOL_THREAD = re.compile(r"\((_handle_workers|_handle_tasks|_handle_results)\)$")
_MANAGER_THREAD = re.compile(r"\((handle_request|accepter|serve_client)\)$")
_HELPER_THREAD = re.compile(r"^QueueFeederThread$|^mpviz-fd-peer$|\((_serve|_pin_memory_loop)\)$")
_FOLD_ABOVE = 12


def _thread_lanes(ix, deadlocks):
    """({(pid, tid)} of the threads drawn in a lane of their own, {(pid, tid)} of the helper
    threads folded into their process's lane): a thread gets a lane when it recorded something
    and is not a helper thread, or is one that is the story (see ``_HELPER_THREAD``)."""
    story = {(d.pid, d.tid) for d in deadlocks} | {(f.pid, f.tid) for f in ix.failures}
    for pid, tid, begin, until in ix.blocked:
        proc = ix.procs.get(pid)
        ended = proc is not None and proc.exit_ns is not None and \
            (ix.kill_ns is None or proc.exit_ns < ix.kill_ns)
        if until is None and not ended:  # it still waits (not: a Pool worker terminated in its
            story.add((pid, tid))        # get), and so do those it waits for
            story.update(ix.must_act(begin, begin.ts_ns))
    story |= {(pid, tid) for _, pid, tid, _, until in ix.waits if until is None}
    threads = [who for who, n in ix.busy.items()
               if n and who[0] != who[1] and who[0] not in ix.watchdogs]
    crowded = len(ix.procs) - len(ix.watchdogs) + len(threads) > _FOLD_ABOVE
    own, folded = set(), set()
    for who in threads:
        name = ix.thread_name(*who)
        helper = _POOL_THREAD.search(name) or (crowded and _HELPER_THREAD.search(name)) or \
            (who[0] in ix.managers and _MANAGER_THREAD.search(name))
        (folded if helper and who not in story else own).add(who)
    return own, folded


WIDTH = 10     # inches: 1000 pixels at the notebook's 100 dpi, the legend under the lanes


def _new(fig, ax, nrows, fast=False):
    if ax is None:
        height = max(2.4, 0.9 + 0.55 * nrows)
        if fast:
            fig = Figure(figsize=(WIDTH, height))
            fig.subplots_adjust(left=0.16, right=0.98, top=1 - 0.45 / height,
                                bottom=0.75 / height)
        else:
            fig = Figure(figsize=(WIDTH, height), layout="constrained")
        ax = fig.add_subplot()
    return fig, ax


def _ending(p):
    if p.signal:
        return "signal"
    if p.exitcode is not None and p.exitcode < 0:
        return "signal"
    if p.exitcode not in (None, 0):
        return "exitcode"
    if p.exit_ns is None:
        return "running"
    return "exit0"


def _ending_words(p):
    if p.signal:
        return p.signal
    if p.exitcode is not None and p.exitcode < 0:
        return f"signal {-p.exitcode}"
    if p.exitcode is not None:
        return f"exit {p.exitcode}"
    return "" if p.exit_ns is None else "exited"


class _TimeAxis:
    """Real time → x, with long stretches where nothing was recorded squeezed to a narrow band
    (their length written on it).

    Event times are sorted; a gap of at least 20 ms in which nothing was recorded and which takes
    more than a quarter of the picture (judged again after each squeeze) is drawn narrow (6 % of
    the busy time). Never squeezed: lock waits and recorded blocking waits (a join, q.join, a
    full pipe: how long a thread waited is the lesson; a wait never satisfied lasts to its
    process's end),
    and Pool tasks from start to done (how long each task ran is the pool's lesson). A squeezed
    band is "nothing recorded", not "idle": a process may have computed all along. Between
    gaps, time is linear, with ticks at round real times.
    """

    def __init__(self, trace, t0, t1, compress):
        self.t0, self.t1 = t0, t1
        self.scale, self.unit = (1e6, "ms") if t1 - t0 < 20e9 else (1e9, "s")
        self.gaps = []                                  # (x from, x to, real length ns)
        cuts = []
        if compress:
            times = np.unique(np.fromiter(map(_TS, trace.events), np.int64,
                                          len(trace.events)))
            ix = st._index(trace)                       # waits and Pool tasks are the story
            # a wait never satisfied lasts as long as its process (as it is drawn), not to
            # the trace's end: what comes after a killed program's end may be squeezed
            spans = [(since, until or _end_of(ix, pid, None, t1))
                     for _, pid, _, since, until in ix.waits]
            spans += [(a, b) for _, _, a, b in ix.tasks]
            spans += [(b.ts_ns, until or _end_of(ix, pid, tid, t1))
                      for pid, tid, b, until in ix.blocked]
            spans += collectives.spans(trace, lambda pid: _end_of(ix, pid, None, t1))
            w0 = np.array([a for a, _ in spans], dtype=float)
            w1 = np.array([b for _, b in spans], dtype=float)
            diffs = np.diff(times)
            top = np.argsort(diffs)[::-1][:8]               # the longest quiet stretches
            gaps = [(float(diffs[i]), float(times[i]), float(times[i + 1])) for i in top]
            shown = float(t1 - t0)
            for length, a, b in gaps:
                if length < max(0.25 * shown, _MIN_SQUEEZE_NS) or shown - length < 0.01 * (t1 - t0):
                    break
                if len(w0) and np.any((w0 < b) & (a < w1)):
                    continue                            # a wait or a task: keep it
                cuts.append((a, b))
                shown -= length
            cuts.sort()
            merged = []                              # neighbouring squeezes become one
            for a, b in cuts:
                if merged and a - merged[-1][1] < 0.04 * shown:
                    merged[-1] = (merged[-1][0], b)
                else:
                    merged.append((a, b))
            cuts = merged
        busy = ((t1 - t0) - sum(b - a for a, b in cuts)) / self.scale
        width = busy * min(0.06, 0.4 / max(1, len(cuts)))
        real, disp, self.pieces = [float(t0)], [0.0], []
        for a, b in cuts:
            self.pieces.append((real[-1], a, disp[-1]))
            real.append(a)
            disp.append(disp[-1] + (a - real[-2]) / self.scale)
            real.append(b)
            disp.append(disp[-1] + width)
            self.gaps.append((disp[-2], disp[-1], b - a))
        self.pieces.append((real[-1], float(t1), disp[-1]))
        real.append(float(t1))
        disp.append(disp[-1] + (t1 - real[-2]) / self.scale)
        self.real, self.disp = np.array(real), np.array(disp)
        self._real, self._disp = real, disp
        self.span = disp[-1]

    def x(self, ts):
        if not self.gaps:
            return (ts - self.t0) / self.scale
        real, disp = self._real, self._disp
        i = min(max(bisect.bisect_right(real, ts) - 1, 0), len(real) - 2)
        if real[i + 1] == real[i]:
            return disp[i]
        return disp[i] + (ts - real[i]) * (disp[i + 1] - disp[i]) / (real[i + 1] - real[i])

    def decorate(self, ax, fast=False):
        from matplotlib.ticker import MaxNLocator
        if not fast:
            ax.set_xlabel(f"time since the trace began ({self.unit})" +
                      ("   (grey ≈ bands: nothing recorded there, squeezed; "
                       "its length written below)"
                       if self.gaps else ""))
        if not self.gaps:
            return
        ticks = []                                      # (x, label, is_gap)
        for a, b, d in self.pieces:                     # the linear pieces between gaps
            if (b - a) / self.scale < 0.04 * self.span and len(self.pieces) > 1:
                continue                                # too narrow to carry a tick
            n = max(1, int(round(8 * (b - a) / self.scale / max(self.span, 1e-12))))
            for v in MaxNLocator(n).tick_values((a - self.t0) / self.scale,
                                                (b - self.t0) / self.scale):
                tv = self.t0 + v * self.scale
                if a <= tv <= b:
                    ticks.append((d + (tv - a) / self.scale, f"{v:g}", False))
        for a, b, gap in self.gaps:
            ax.axvspan(a, b, color="#eeeeee", zorder=0.5)
            ticks.append(((a + b) / 2, "≈\n+" + _duration(gap), True))
        kept = []
        for t in sorted(ticks, key=lambda t: (not t[2], t[0])):     # gap marks first
            room = 0.07 if t[2] else 0.045
            if all(abs(t[0] - k[0]) > (0.07 if k[2] else room) * self.span for k in kept):
                kept.append(t)
        kept.sort()
        ax.set_xticks([t[0] for t in kept])
        ax.set_xticklabels([t[1] for t in kept], fontsize=8)
        for label, t in zip(ax.get_xticklabels(), kept):
            if t[2]:
                label.set_color("#888888")
                label.set_fontsize(7)


def _duration(ns):
    """A length of time the way people say it: 350 µs, 2.4 ms, 12 ms, 1.4 s."""
    if ns < 1e6:
        return f"{ns / 1e3:.0f} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.1f} ms" if ns < 1e7 else f"{ns / 1e6:.0f} ms"
    return f"{ns / 1e9:.1f} s"


def _clusters(items, span, gap=0.05):
    """Group (x, key, value) items whose x are within `gap`·span of each other, per key."""
    out = []
    for item in sorted(items, key=lambda i: (str(i[1]), i[0])):
        last = out[-1] if out else None
        if last and last[0][1] == item[1] and item[0] - last[-1][0] <= gap * span:
            last.append(item)
        else:
            out.append([item])
    return out


def _message_kind(flow, handles):
    if isinstance(flow, Request):               # (grey as a message; its own legend line)
        return "fd_request"
    if flow.put.args.get("msg") in handles:
        return "handle"
    if (flow.nbytes or 0) >= BIG_MESSAGE:
        return "copy"
    return "message"


def _bundled_arrows(ax, flows, handles, axis, row, span, used, said, what="messages"):
    """Too many arrows to see one by one: one line per (from row, to row, kind, time bin).
    `what` the arrows are (messages, or requests for an fd) names the collection and the note."""
    groups = defaultdict(lambda: ([], []))
    for f in flows:
        key = _message_kind(f, handles)
        g = groups[(row(f.put.pid, f.put.tid), row(f.get.pid, f.get.tid), key)]
        g[0].append(f.put.ts_ns)
        g[1].append(f.get.ts_ns)
    segs, colors, widths = [], [], []
    for (ra, rb, key), (puts, gets) in groups.items():
        xa = np.interp(np.asarray(puts, dtype=float), axis.real, axis.disp)
        xb = np.interp(np.asarray(gets, dtype=float), axis.real, axis.disp)
        for seg, n in _bundle(xa, xb, ra, rb, span):
            segs.append(seg)
            colors.append(COLORS[key])
            widths.append(min(5.0, 0.6 + 0.8 * math.log10(n)))
        used.add(key)
    ax.add_collection(LineCollection(segs, colors=colors, linewidths=widths, alpha=0.6,
                                     zorder=5, gid=what))
    said.append(f"{len(flows):,} {what} drawn as {len(segs):,} bundles (thicker = more)")


def _bundle(xa, xb, ra, rb, span, nbins=16):
    """Lines from row `ra` at xa[i] to row `rb` at xb[i] (arrays), as ((start, end), count)
    bundles: one per `nbins`-th of the time axis, from the mean start to the mean end."""
    bins = np.clip((xa / span * nbins).astype(np.int64), 0, nbins - 1)
    n = np.bincount(bins, minlength=nbins)
    sa, sb = np.bincount(bins, xa, nbins), np.bincount(bins, xb, nbins)
    return [(((sa[i] / n[i], ra), (sb[i] / n[i], rb)), int(n[i])) for i in np.nonzero(n)[0]]


def _draw_fd_passes(ax, ix, x, row, span, max_arrows, used, said):
    """Each fd handed over on a Unix socket (SCM_RIGHTS) as a thin dashed arrow from the thread
    that sent it (torch: the producer's resource_sharer ``_serve`` thread, when the consumer
    asked; mpviz: the thread that pickled the handle and offered the fd) to the thread that
    received it while unpickling the handle's message. Where that message's get is drawn away
    from the fd's end, a dotted line joins them: this fd is that message's memory."""
    passes = ix.fd_passes
    if not passes:
        return []
    gets = {f.put.args.get("msg"): f.get for f in ix.flows if f.get is not None}
    ends, links = [], []
    for sent, got in passes:
        a = (x(sent.ts_ns), row(sent.pid, sent.tid))
        b = (x(got.ts_ns), row(got.pid, got.tid))
        ends.append((a, b))
        get = gets.get(ix.fd_messages.get(st._fd_key(got)))
        if get is not None:
            g = (x(get.ts_ns), row(get.pid, get.tid))
            if g[1] != b[1] or abs(g[0] - b[0]) > span / 300:    # apart by more than a pixel
                links.append((b, g))
    style = dict(color=COLORS["fd"], linestyle=(0, (3, 2)), zorder=5.5)
    if len(ends) <= max_arrows:
        for a, b in ends:
            # bowed towards later time, so that it never hides under the straight arrow of
            # the request that asked for it (which goes the other way at the same moment)
            bow = 0.25 if b[1] < a[1] else -0.25
            ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=7, lw=0.9,
                                         connectionstyle=f"arc3,rad={bow}", shrinkA=0,
                                         shrinkB=1, gid="fd", **style))
    else:                             # too many for heads: dashed bundles, thicker for more
        ends, widths = _bundle_lines(ends, span)
        said.append(f"{len(passes):,} fds handed over drawn as {len(ends):,} bundles")
        ax.add_collection(LineCollection(ends, linewidths=widths, alpha=0.6, gid="fd", **style))
        if len(links) > max_arrows:
            links = _bundle_lines(links, span)[0]
    if links:
        ax.add_collection(LineCollection(links, colors=COLORS["fd"], linestyles=":",
                                         linewidths=0.8, zorder=5.5, gid="fd link"))
    used.add("fd")
    return ends if len(ends) <= max_arrows else []     # (where labels had better not go)


def _bundle_lines(lines, span):
    """((x0, y0), (x1, y1)) lines bundled per pair of rows and time bin: (lines, widths)."""
    by_rows = defaultdict(list)
    for a, b in lines:
        by_rows[(a[1], b[1])].append((a[0], b[0]))
    out, widths = [], []
    for (ra, rb), xs in by_rows.items():
        xs = np.array(xs, dtype=float)
        for seg, n in _bundle(xs[:, 0], xs[:, 1], ra, rb, span):
            out.append(seg)
            widths.append(min(4.0, 0.5 + 0.7 * math.log10(n)))
    return out, widths


def _end_of(ix, pid, tid, t1):
    """When an unfinished wait ends on the picture: its thread's end, else its process's exit,
    else the trace's end `t1` (the axis and the boxes must agree, so both ask this)."""
    proc = ix.procs.get(pid)
    return ix.thread_end.get((pid, tid)) or (proc.exit_ns if proc else None) or t1


_TS = operator.itemgetter(0)    # an event's ts_ns
_RETRY_GAP_NS = 5_000_000     # a wait that starts again this soon after giving up: the same wait


def _runs_of_waits(ix, t1):
    """The recorded waits as (pid, tid, since, end, finished, words, n): a thread that waits on
    the same thing again as soon as its wait gave up -- ``get(timeout=0.2)`` in a loop -- is
    one run of n waits, not n boxes each with its own label. An unfinished wait lasts as long
    as its thread (or its process, or the trace)."""
    runs = []
    for pid, tid, begin, until in sorted(ix.blocked, key=lambda w: (w[0], w[1], w[2].ts_ns)):
        end = until or _end_of(ix, pid, tid, t1)
        words = ix.wait_words(begin) if until else ix.wait_words_at(begin, end - 1)
        last = runs[-1] if runs else None
        if (last and last[:2] == (pid, tid) and last[4] and last[5] == words and last[7]
                and begin.ts_ns - last[3] <= _RETRY_GAP_NS):
            runs[-1] = (pid, tid, last[2], end, until is not None, words, last[6] + 1,
                        id(begin) in ix.gave_up)
        else:
            runs.append((pid, tid, begin.ts_ns, end, until is not None, words, 1,
                         id(begin) in ix.gave_up))
    return [r[:7] for r in runs]


_MANY_WAITS = 200     # more finished waits than this: painted as a share of each pixel column


def _coverage(x0, x1, width, nbins):
    """For `nbins` columns `width` wide from 0: the share of each covered by the spans
    [x0[i], x1[i]] (spans that do not overlap, as one thread's waits)."""
    x0, x1 = np.clip(x0, 0, nbins * width), np.clip(np.maximum(x1, x0), 0, nbins * width)
    c0 = np.minimum((x0 / width).astype(np.int64), nbins - 1)
    c1 = np.minimum((x1 / width).astype(np.int64), nbins - 1)
    out = np.zeros(nbins)
    same = c0 == c1
    np.add.at(out, c0[same], x1[same] - x0[same])
    c0, c1, x0, x1 = c0[~same], c1[~same], x0[~same], x1[~same]
    np.add.at(out, c0, (c0 + 1) * width - x0)            # the first column's part
    np.add.at(out, c1, x1 - c1 * width)                  # the last column's
    full = np.zeros(nbins + 1)                           # the columns wholly inside
    np.add.at(full, c0 + 1, 1)
    np.add.at(full, c1, -1)
    return out / width + np.cumsum(full[:-1])


def _merge(spans, tolerance):
    """Union of (x0, x1) intervals, joining those closer than `tolerance` (one pixel)."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + tolerance:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _wrap(text, width):
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width and line:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "\n".join(lines)
