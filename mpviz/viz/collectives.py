"""torch.distributed on the timeline: each rank's collectives, joined where the ranks met.

A collective completes only when every rank of its group has called it. Each rank's call is
drawn on its lane in two parts, and the ranks are joined at the moment the last one arrived::

    rank 0  ──[░░░░░░░░░░░░████]──     hatched (░): waiting for the others to arrive
                           │ all_reduce #3
    rank 1  ───────────────[████]──     solid: every rank is there, the backend moves the bytes
                           ^ the last arrival: who waited for whom reads off the hatching

A rank still inside a call after every other rank has left it (their calls disagreed in
size; they were aborted) is hatched from there on: it waits, for bytes that will not come.

A call that some rank of its group never made is hatched to its end, and says who is missing
("all_reduce #2: rank 1 never came"); ranks at the same seq in different collectives are joined
in magenta ("all_reduce #3 ≠ barrier #3"). ``init_process_group`` is drawn the same way (the
rendezvous: who waited for the store). The events are ``dist.rendezvous`` and
``dist.collective`` (read by mpviz.trace.dist_verdict.Ranks, as the verdicts read them). A send
and its recv are joined the same way, as one meeting of their pair ("send #1 to rank 1").
"""
import weakref
from collections import defaultdict

from matplotlib.collections import LineCollection, PatchCollection

from ..trace.dist_verdict import P2P, Ranks, _called, _ranks, watchdog_killed
from .colors import COLORS

MAX_JOINS = 400          # more meetings than this: the bars only (a long training loop)
_read = weakref.WeakKeyDictionary()   # trace -> (its length and end, its Ranks)


def _ranks_of(trace):
    """``Ranks(trace)``, read once per trace (a pass over every event: a timeline asks twice,
    for its time axis and for its bars), again when the trace has grown."""
    key = (len(trace.events), trace.events[-1].ts_ns if trace.events else 0)
    found = _read.get(trace)
    if found is None or found[0] != key:
        found = _read[trace] = (key, Ranks(trace))
    return found[1]


def draw(ax, trace, x, proc_row, t1, span, labels, used, max_labels, end_of, said):
    """Draw the collectives and rendezvous of `trace` on the lanes `proc_row` ({pid: row}).
    `end_of(pid)`: where an unfinished call is drawn to (its process's end, or the trace's);
    `said`: the list of what was aggregated, written under the lanes."""
    from .timeline import _ABOVE, _rects
    ranks = _ranks_of(trace)
    if not ranks:
        return
    killed = watchdog_killed(trace)          # (killed after the verdict: they never left)
    ended = {p.pid: p.exit_ns for p in trace.processes()
             if p.exit_ns is not None and p.pid not in killed}
    waits, works, joins, odd, words = _meetings(ranks, x, proc_row, end_of, ended, t1)
    _rendezvous(ranks, x, proc_row, end_of, waits, works, joins, words)
    if not waits:
        return
    boxes = _boxes(waits, span)
    labels.widen(ax.add_collection(PatchCollection(
        _rects(boxes), facecolors="white", edgecolors=COLORS["collective_wait"], hatch="\\\\\\",
        linewidths=0.8, zorder=2, gid="collective waits")), boxes)
    used.add("collective_wait")
    if works:
        boxes = _boxes(works, span)
        labels.widen(ax.add_collection(PatchCollection(
            _rects(boxes), facecolors=COLORS["collective"], edgecolors="none", zorder=2,
            gid="collectives")), boxes)
        used.add("collective")
    if len(joins) + len(odd) > MAX_JOINS:
        said.append(f"{len(joins) + len(odd):,} collectives: their joins are not drawn (more "
                    f"than {MAX_JOINS}); each rank's calls are, merged to pixel columns")
    for lines, color, gid in ((joins, COLORS["collective"], "collective joins"),
                              (odd, COLORS["disagree"], "collectives that disagree")):
        if lines and len(joins) + len(odd) <= MAX_JOINS:
            ax.add_collection(LineCollection([((a, lo - 0.2), (a, hi + 0.2))
                                              for a, lo, hi in lines], colors=color,
                                             linewidths=1.6 if gid == "collective joins"
                                             else 2.2, zorder=6, gid=gid))
            labels.lines += [((a, lo), (a, hi)) for a, lo, hi in lines]
            used.add("collective" if gid == "collective joins" else "disagree")
    if len(words) <= max_labels:
        for a, r, text, bad in words:
            labels.add(ax.annotate(text, (a, r), xytext=(0, 9), textcoords="offset points",
                                   fontsize=6.5, ha="center", va="bottom",
                                   color=COLORS["failed"] if bad else COLORS["collective"],
                                   fontweight="bold" if bad else "normal", zorder=7,
                                   bbox=dict(boxstyle="square,pad=0.05", fc="white", ec="none",
                                             alpha=0.8)),
                       -1 if bad else 1, _FROM_START if bad else _ABOVE)


def _meetings(ranks, x, proc_row, end_of, ended, t1):
    """Each collective's meeting, as spans and words: (waits, works -- (x0, x1, row) each --,
    joins and odd -- (x, lowest row, highest row) --, words -- (x, row, text, bad?))."""
    waits, works, joins, odd, words = [], [], [], [], []
    meetings = defaultdict(dict)
    for c in ranks.calls:     # (an async one never waited for: when it ended is not known)
        if c.pid in proc_row and not (c.async_op and c.end_ns is None):
            meetings[(c.group, c.seq, c.p2p)][c.rank] = c
    for (group, seq, p2p), calls in meetings.items():
        # (a send and its recv: one meeting of its pair, drawn as one collective)
        ops = [_called(max(calls.values(), key=lambda c: P2P[c.op] == "send"))] if p2p else \
            sorted({c.op for c in calls.values()})
        everyone = set(calls) >= set(group)
        # (ranks in different collectives never meet: each waits for its own to fill up)
        last = max(c.begin_ns for c in calls.values()) if everyone else None
        met_at = last if len(ops) == 1 else None
        rows = []
        ends = {k: c.end_ns or end_of(c.pid) for k, c in calls.items()}
        disagree = len(ops) > 1 or len({c.nbytes for c in calls.values()} - {None}) > 1
        for k, c in calls.items():
            r = proc_row[c.pid]
            end = ends[k]
            met = met_at if met_at is not None and met_at < end else end
            waits.append((x(c.begin_ns), x(met), r))
            # solid while the others are in it too; a rank still in it after every other
            # rank has left it, where the meeting failed (their calls disagreed in size, or
            # this one raised or never returned), waits -- for bytes that will not come:
            # hatched, not "every rank is there". (Ranks of a meeting that worked leave it a
            # little apart, more so on a busy machine: solid to the end.)
            others = max((e for j, e in ends.items() if j != k), default=end)
            failed = disagree or c.error is not None or c.end_ns is None
            if met < end:
                works.append((x(met), x(max(met, min(end, others) if failed else end)), r))
                if others < end and failed:
                    waits.append((x(max(met, others)), x(end), r))
            rows.append(r)
        name = ops[0] if p2p else " ≠ ".join(f"{op} #{seq}" for op in ops)
        if everyone and len(rows) > 1:
            (odd if len(ops) > 1 else joins).append((x(last), min(rows), max(rows)))
            words.append((x(last), min(rows), name, len(ops) > 1))
        elif not everyone:
            missing = [k for k in group if k not in calls]
            first = min(calls.values(), key=lambda c: c.begin_ns)
            gone = all(_left(ranks, ranks.pid_of.get(k), ended) <= (first.end_ns or t1)
                       for k in missing)
            words.append((x(first.begin_ns), proc_row[first.pid],
                          f"{name}: {_ranks(missing)} never came" if gone else
                          f"{name}: waits for {_ranks(missing)}", True))
    return waits, works, joins, odd, words


# where a wait's words go ("all_reduce #2: waits for rank 1", anchored at the wait's start): to
# the right of the start first, over the wait they name -- centred on the start, half of them
# would lie over what came before (init_process_group's span)
_FROM_START = ((0, 9, 1), (0, 17, 1), (0, -19, 1), (0, -11, 1), (0, 9), (0, 17))


def spans(trace, end_of):
    """``[(from_ns, to_ns)]`` of every call and rendezvous: the time axis never squeezes them
    (how long a rank waited for the others is the lesson)."""
    ranks = _ranks_of(trace)
    out = [(c.begin_ns, c.end_ns or end_of(c.pid)) for c in ranks.calls
           if not (c.async_op and c.end_ns is None)]
    for pid, begin in ranks.arrived.items():
        end = ranks.left.get(pid)
        out.append((begin.ts_ns, end.ts_ns if end is not None else end_of(pid)))
    return out


def _boxes(spans, span):
    """``[(x0, x1, y, height)]`` of spans ``(x0, x1, row)``, merged per row where they are
    closer than a pixel column (3,000 all_reduces are a few hundred boxes, not 6,000), and a
    call of 50 us still a sliver."""
    from .timeline import _BINS, _merge
    rows = defaultdict(list)
    for a, b, r in spans:
        rows[r].append((a, max(b, a + span / 2000)))
    return [(a, b, r - 0.2, 0.4) for r, on in rows.items()
            for a, b in _merge(sorted(on), span / _BINS)]


def _left(ranks, pid, ended):
    """When rank `pid` began to leave its group (raised, destroyed it, ended); inf: never."""
    times = [ranks.raised_ns.get(pid), ranks.destroyed.get(pid), ended.get(pid)]
    return min([t for t in times if t is not None] or [float("inf")])


def _rendezvous(ranks, x, proc_row, end_of, waits, works, joins, words):
    """init_process_group: each rank from its arrival to its leaving; joined at the last
    arrival when every rank of the world came."""
    arrived = {pid: e for pid, e in ranks.arrived.items() if pid in proc_row}
    if not arrived:
        return
    world = max((ranks.world.get(pid, 0) for pid in arrived), default=0)
    last = max(e.ts_ns for e in arrived.values())
    everyone = len(arrived) >= world       # (then: the store, gloo connecting every pair)
    for pid, begin in arrived.items():
        end = ranks.left.get(pid)
        end = end.ts_ns if end is not None else end_of(pid)
        met = last if everyone and last < end else end
        waits.append((x(begin.ts_ns), x(met), proc_row[pid]))
        if met < end:
            works.append((x(met), x(end), proc_row[pid]))
    rows = [proc_row[pid] for pid in arrived]
    if everyone and all(
            ranks.left.get(pid) is not None and not ranks.left[pid].args.get("error")
            for pid in arrived):
        if len(rows) > 1:
            joins.append((x(last), min(rows), max(rows)))
        words.append((x(last), min(rows), "init_process_group", False))
    else:
        came = len(arrived)
        first = min(arrived, key=lambda pid: arrived[pid].ts_ns)
        failed = [pid for pid in arrived if ranks.left.get(pid) is not None and
                  ranks.left[pid].args.get("error")]
        text = (f"init_process_group: {came} of {world} ranks came" if came < world else
                "init_process_group failed")
        words.append((x(arrived[failed[0] if failed else first].ts_ns),
                      proc_row[failed[0] if failed else first], text, True))
