"""The wait-for graph: which thread holds which lock, and who is blocked behind it.

    [producer / main thread] ──holds──► (lock L1) ──blocks──► [consumer / main thread]

Nodes are threads (boxes) and locks (rounded); an arrow goes from an owner to its lock
("holds") and from the lock to each thread waiting for it ("blocks"). Read along the arrows:
whoever is at the start of a chain must release before anyone behind can go on.

Other recorded waits (``state.blocked``: a join, q.join, a full pipe, an Event ...) are drawn
the same way, from whoever must act to whoever waits::

    [producer / main thread] ──must exit──► [main / main thread]              p.join()
    [producer / QueueFeederThread] ──must finish──► [producer / main thread]  exiting
    (queue Q: pipe full, nobody has read it) ──blocks──► [producer / QueueFeederThread]
    [consumer / main thread] ──must call task_done()──► (JoinableQueue Q) ──blocks──► [main]

Two pictures mean "never":

* a **cycle** (drawn in crimson): T1 holds L1 and waits for L2, T2 holds L2 and waits for L1.
  Each waits for the other; nobody goes on. Layout: the cycle's nodes on a circle. (An arc
  back above the boxes, in a wait's colour, closes a round someone can still end: ``_columns``.)
* a **ghost owner** (a dashed box): the lock is a copy made by ``fork`` while another thread of
  the parent held it. ``fork`` copies memory, not threads: in the child that owner does not
  exist, so nobody will ever release the child's copy. (The same box marks an owner whose
  process or thread ended while holding a lock.)
"""
import math
import textwrap

from matplotlib.patches import FancyArrowPatch
from matplotlib.transforms import Affine2D

from ..trace import analysis as st
from .colors import COLORS, legend
from .figure import Figure, without_gc


@without_gc
def wait_for(trace, at=None, ax=None, title=None):
    """Draw threads and locks at instant `at` as a graph (owner → lock → waiter); return the Figure.

    `at=None`: the moment the run got stuck if it did (just before the stuck processes were
    killed), else the instant at which the most threads wait, else the end of the trace.

    Everything here is computed by ``analysis.state_at`` (trace/analysis.py); this module only
    places and draws it. The instant defaults to the moment a stuck run is judged
    (``analysis.stuck_moment``), else the instant at which the most threads wait
    (``analysis.busiest_wait``), else the end.
    The steps: the graph (``_graph``), where each node goes (``_layout``), the boxes
    (``_draw_nodes``), the arrows (``_draw_edges``), the title and the legend.
    """
    if at is None:
        at = st.stuck_moment(trace)
    if at is None:
        at = st.busiest_wait(trace)
    state = st.state_at(trace, at)
    nodes, edges, cycle_nodes, red_threads = _graph(state)
    in_cycle = set(cycle_nodes)
    pos = _layout(nodes, edges, cycle_nodes)
    xs = [x for x, _ in pos.values()] or [0]
    ys = [y for _, y in pos.values()] or [0]
    top = max(ys)                        # arrows that go back or skip a column arc above it
    arcs = any(_arc(pos[a], pos[b], top) for a, b, _, _ in edges if a not in in_cycle)
    owned = ax is None
    if owned:
        fig = Figure(figsize=(min(14, max(7.5, 1.5 + 1.7 * (max(xs) - min(xs) + 1.6))),
                              1.6 + 1.0 * (max(ys) - min(ys) + 1.4 + (0.6 if arcs else 0)) +
                              0.45 * len(state.deadlocks)), layout="constrained")
        ax = fig.add_subplot()
    fig = ax.figure
    ax.set_axis_off()
    if not nodes:
        ax.text(0.5, 0.5, "No thread is waiting for a lock or blocked in a recorded wait\n"
                "at this instant, and no lock is held.", ha="center", va="center", fontsize=10,
                transform=ax.transAxes)
    texts, used = _draw_nodes(ax, nodes, pos, in_cycle, red_threads)
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7 + (0.6 if arcs else 0))
    used |= _draw_edges(ax, edges, pos, texts, in_cycle, top)
    _title(ax, state, title)
    keys = [k for k in ("holding", "waiting", "blocked", "deadlock", "ghost") if k in used]
    if keys:
        legend(ax, keys, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncols=len(keys))
    if owned:                            # (in viz.plot's figure, plot writes them once)
        from . import notes_under
        notes_under(fig, getattr(trace, "notes", ()))
    return fig


def _graph(state):
    """The graph at `state`: (nodes {key: (kind, text)}, edges [(a, b, word, key)], the keys
    of the nodes on a cycle in order round it, the threads stuck for good)."""
    labels, names = state.labels, state.thread_names
    nodes, edges = {}, []                # node key -> (kind, text); edges (a, b, word, key)
    dead_threads = {(d.pid, d.tid) for d in state.deadlocks}
    cycle_nodes = []
    for d in state.deadlocks:
        for i, item in enumerate(d.cycle[:-1]):
            key = ("thread", item) if i % 2 == 0 else None
            if key is None:
                continue
            if key not in cycle_nodes:
                cycle_nodes.append(key)
    for lk in state.locks:
        lkey = ("lock", lk.id, lk.copy_in)
        copy = f"\nthe copy in {labels.get(lk.copy_in, lk.copy_in)}" if lk.copy_in else ""
        nodes[lkey] = ("lock", f"{lk.name or lk.id}{copy}")
        for o in lk.owners:
            if o.ghost:
                okey = ("ghost", o.pid, o.tid, lk.copy_in)
                where = labels.get(lk.copy_in, lk.copy_in) if lk.copy_in else "here"
                nodes[okey] = ("ghost", f"{labels.get(o.pid, o.pid)}'s thread '{o.thread}'\n"
                                        f"(does not exist in {where})")
            else:
                okey = ("thread", (o.pid, o.tid))
                nodes[okey] = ("thread", _thread_text(labels, names, o.pid, o.tid))
            edges.append((okey, lkey, "holds", "ghost" if o.ghost else "holding"))
        for pid, tid, _ in lk.waiters:
            wkey = ("thread", (pid, tid))
            nodes[wkey] = ("thread", _thread_text(labels, names, pid, tid))
            edges.append((lkey, wkey, "blocks", "deadlock" if (pid, tid) in dead_threads
                          else "waiting"))
    in_cycle = set(cycle_nodes)
    for d in state.deadlocks:                      # the locks of a cycle go on the circle too
        for i in range(1, len(d.cycle) - 1, 2):
            owner = d.cycle[i + 1]
            for lk in state.locks:
                if lk.id == d.cycle[i] and any((o.pid, o.tid) == owner for o in lk.owners):
                    key = ("lock", lk.id, lk.copy_in)
                    if key not in in_cycle:
                        idx = cycle_nodes.index(("thread", d.cycle[i - 1]))
                        cycle_nodes.insert(idx + 1, key)
                        in_cycle.add(key)
            for b in state.blocked:           # ... and what else its threads wait on there
                if (b.pid, b.tid) == d.cycle[i - 1] and b.target == d.cycle[i] and \
                        b.on in _OBJECT:      # (a future, a Pipe: _add_blocked's node)
                    key = ("lock", f"{b.on}:{b.target}", None)
                    if key not in in_cycle:
                        idx = cycle_nodes.index(("thread", d.cycle[i - 1]))
                        cycle_nodes.insert(idx + 1, key)
                        in_cycle.add(key)
    _add_blocked(state, nodes, edges, dead_threads)
    return nodes, edges, cycle_nodes, dead_threads


def _draw_nodes(ax, nodes, pos, in_cycle, dead_threads):
    """A box per thread, a rounded one per lock, a dashed one per ghost owner (red: stuck);
    ({key: its text}, the legend keys used)."""
    texts, used = {}, set()
    for key, (kind, text) in nodes.items():
        x, y = pos[key]
        red = key in in_cycle or (kind == "thread" and key[1] in dead_threads)
        edge = COLORS["deadlock"] if red else ("#555555" if kind != "ghost" else COLORS["ghost"])
        box = dict(boxstyle="round,pad=0.5" if kind == "lock" else "square,pad=0.5",
                   fc="#f7f7f7" if kind == "lock" else "white", ec=edge,
                   lw=2.0 if red else 1.2, ls="--" if kind == "ghost" else "-")
        texts[key] = ax.text(x, y, text, ha="center", va="center", fontsize=8.5,
                             color="#777777" if kind == "ghost" else "black", bbox=box,
                             zorder=3)
        if kind == "ghost":
            used.add("ghost")
    return texts, used


def _draw_edges(ax, edges, pos, texts, in_cycle, top):
    """An arrow per edge with its word ("holds", "blocks", "must exit" ...); the legend keys."""
    used = set()
    aspect = _aspect(ax)
    xs_of = [x for k, (x, _) in pos.items() if k not in in_cycle]
    alone = {x for x in xs_of if xs_of.count(x) == 1}      # columns of one box
    for a, b, word, key in edges:
        red = key == "deadlock" or (a in in_cycle and b in in_cycle)
        color = COLORS["deadlock"] if red else COLORS.get(key, "#555555")
        if key == "ghost":
            color = COLORS["ghost"]
        used.add("deadlock" if red else key)
        if a in in_cycle:
            # the circle's arcs: each word beside the middle of its own arc, on the side it
            # bends to -- not at the middle of its chord, which may lie on a box (a long arc
            # over another box) or on the arc back (two arrows both ways between two boxes)
            style = "arc3,rad=0.12"
            at, (ox, oy), ha, va = _beside_arc(ax, pos[a], pos[b], 0.12)
            ax.annotate(word, (0, 0), xycoords=at, xytext=(ox, oy), textcoords="offset points",
                        ha=ha, va=va, fontsize=7.5, color=color, zorder=4)
        else:
            style, at = _route(pos[a], pos[b], top, aspect, alone)
            ax.text(at[0], at[1] + 0.12, word, ha="center", va="bottom", fontsize=7.5,
                    color=color, zorder=4)
        arrow = FancyArrowPatch(pos[a], pos[b], arrowstyle="-|>", mutation_scale=14,
                                lw=2.2 if red else 1.5, color=color,
                                ls="--" if key == "ghost" else "-",
                                patchA=texts[a].get_bbox_patch(),
                                patchB=texts[b].get_bbox_patch(), shrinkA=4, shrinkB=4,
                                connectionstyle=style, zorder=2)
        ax.add_patch(arrow)
    return used


def _beside_arc(ax, a, b, rad):
    """Where the word of an ``arc3,rad=rad`` arrow from `a` to `b` goes: (its point, in
    coordinates found when the figure is drawn: the figure's layout moves the axes after this
    and so changes where the arc bends; an offset in points away from the chord; ha, va).
    matplotlib's arc3 is a quadratic curve whose control point sits `rad` × the chord's length
    off its middle, to the left of the way, on screen; the curve's middle is half as far off."""
    def middle(renderer):
        (x1, y1), (x2, y2) = ax.transData.transform([a, b])
        nx, ny = rad * (y2 - y1), -rad * (x2 - x1)          # (display units: pixels)
        return Affine2D().translate((x1 + x2 + nx) / 2, (y1 + y2 + ny) / 2)

    (x1, y1), (x2, y2) = a, b                     # the side it bends to, which the layout
    nx, ny = y2 - y1, -(x2 - x1) * _aspect(ax)    # does not change (in units of a data y)
    if abs(ny) >= abs(nx):                                 # bends up or down: word above/below
        return middle, (0, 5 if ny >= 0 else -5), "center", "bottom" if ny >= 0 else "top"
    return middle, (6 if nx > 0 else -6, 0), "left" if nx > 0 else "right", "center"


def _title(ax, state, title):
    """The title: the instant and how to read the arrows; in red, why the run is stuck."""
    when = (state.t_ns - state.t0_ns) / 1e6
    head = title or (f"Who waits for whom (at {when:.1f} ms): " +
                     ("who must act → what → who waits" if state.blocked else
                      "owner → lock → waiter"))
    if state.idle and not title:         # (their waits are not drawn: _add_blocked)
        idle = sorted(str(state.labels.get(pid, pid)) for pid in state.idle)
        head += (f"\nidle, not stuck (waiting for their next task, not drawn): "
                 f"{', '.join(idle[:6])}{' ...' if len(idle) > 6 else ''}")
    if state.deadlocks:
        reasons = []
        for d in state.deadlocks:
            r = d.reason if d.cycle else f"{state.labels.get(d.pid, d.pid)}: {d.reason}"
            if r not in reasons:
                reasons.append(r)
        inches = ax.figure.bbox.width / ax.figure.dpi          # (a Figure's or a SubFigure's)
        width = min(110, int(inches * 12.5))                    # characters of 9.5 pt
        ax.set_title(head + "\n" + "\n".join(textwrap.fill("STUCK FOR GOOD — " + r, width)
                                             for r in reasons[:3]),
                     loc="left", fontsize=9.5, color=COLORS["deadlock"])
    else:
        ax.set_title(head, loc="left", fontsize=10)


# The object in the middle, when there is one: (rounded node text, who must act in words).
_OBJECT = {"pipe.write": "{id}\npipe full: {who}",
           "queue.join": "{id} (a JoinableQueue)\nnot every item is task_done(): {who}",
           "queue.get": "{id}\nempty: {who}",
           "queue.put": "{id}\nfull: {who}",
           "thread_queue.get": "{id}\nempty: {who}",             # (a queue.Queue's: threads')
           "thread_queue.put": "{id}\nfull: {who}",
           "thread_queue.join": "{id}\nnot every item is task_done(): {who}",
           "pool.result": "Pool job {id}\n{who}",
           "event": "{id}\nwho will set() it: not recorded",
           "condition": "{id}\nwho will notify() it: not recorded",
           "barrier": "{id}\nwho else must arrive: not recorded",
           "future": "{id}\n{who}",         # "the result of task(3)": who runs it, if known
           "proxy": "{id}\n{who}"}          # "get() on the Manager's Queue 1 ...: nothing in it"


# Who must act, when the trace shows nobody who could.
_NOBODY = {"pipe.write": "nobody has read it yet", "queue.put": "nobody has got from it yet",
           "queue.get": "nobody has put into it yet", "pool.result": "no task of it is running",
           "thread_queue.get": "no thread of its process has put into it yet",
           "thread_queue.put": "no thread of its process has got from it yet",
           "thread_queue.join": "no thread of its process has got from it yet",
           "future": "who runs its task: not recorded", "proxy": "who must act: not recorded"}


def _add_blocked(state, nodes, edges, dead=frozenset()):
    """Nodes and edges for the threads blocked in recorded waits (see the module text).

    Where the trace cannot say who must act (who will set an Event, notify a Condition), the
    waiter hangs off a rounded node that says so."""
    labels, names = state.labels, state.thread_names
    alive = {(p.pid, tid) for p in state.processes for tid, _ in p.threads}
    for b in state.blocked:
        if b.pid in state.idle:          # waiting for its next task: no part of a hang
            continue                     # (the title names it idle)
        wkey = ("thread", (b.pid, b.tid))
        nodes[wkey] = ("thread", _thread_text(labels, names, b.pid, b.tid))
        actors = []
        for pid, tid in b.waits_for:
            akey = ("thread", (pid, tid))
            if akey not in nodes:
                ended = "" if (pid, tid) in alive else f"\n({state.ended.get(pid, 'ended')})"
                nodes[akey] = ("thread", _thread_text(labels, names, pid, tid) + ended)
            actors.append(akey)
        template, must = _OBJECT.get(b.on), b.must or st.MUST.get(b.on, "must act")
        must = must.partition("; ")[0]               # (the arrow's word; the rest: the verdict's)
        style = "deadlock" if (b.pid, b.tid) in dead else "blocked"   # (`dead`: stuck for good)
        if template is None:                         # a join: straight from the one to the other
            edges.extend((a, wkey, must, style) for a in actors)
            continue
        who = b.nobody or _NOBODY.get(b.on, "")
        okey = ("lock", f"{b.on}:{b.target}", None)  # drawn as a rounded node, like a lock
        if okey not in nodes:
            name = state.channel_names.get(b.target, b.target)   # "Queue 1", as the timeline
            if b.on in ("event", "condition", "barrier"):          # "Event 1", as the timeline
                name = b.what.removesuffix(".wait()").removesuffix(".wait_for()")
            elif b.on in ("future", "proxy"):      # "the result of task(3)", never an id
                name = b.what
            elif b.on.startswith("thread_queue."):  # "get() on queue.Queue 1: ...", never an id
                name = b.what.split(":")[0].split(" on ", 1)[-1]
            text = template.format(id=name, who=who if not actors else "")
            if b.on == "queue.get" and ", but this get() waits for" in b.what:
                # not empty: messages wait in it, behind a read lock nobody releases
                text = f"{name}'s read lock\n({b.what.split(': ', 1)[1].split(', but')[0]})"
            dropped = len(state.dropped.get(b.target, ())) if b.on.startswith("queue.") else 0
            if dropped:                  # (what it waits for was put, and will never come)
                text = (text.rstrip(": \n") + f"\n{dropped} put, dropped by its feeder "
                        f"(could not pickle)")
            nodes[okey] = ("lock", text.rstrip(": \n"))
        edges.extend((a, okey, must, style) for a in actors
                     if (a, okey, must, style) not in edges)
        edges.append((okey, wkey, "blocks", style))


def _arc(a, b, top, aspect=1.0):
    """How much an arrow from `a` to `b` bends (matplotlib's arc3 ``rad``): 0 to the next
    column; an arrow that goes back, or past a column, runs above the top row (y `top`),
    where no box is -- a straight line through a box would read as coming from it. (arc3
    bends in display space: `aspect` is how many times longer a data unit is across than up.)"""
    (xa, ya), (xb, yb) = a, b
    if 0 < xb - xa <= COLUMN * 1.01:
        return 0.0
    if abs(xb - xa) < 1e-9:
        return 0.5
    height = top + 0.8 - (ya + yb) / 2        # the curve's middle this much above the chord
    return round(-2 * height / ((xb - xa) * aspect), 3)


def _route(a, b, top, aspect, alone):
    """(matplotlib connection style, where its word goes) for an arrow from `a` to `b`.

    To the next column and another row, where the box at one end is alone in its column: down
    (or up) that column, then across into the other box -- a fan of straight lines from one box
    to a column of many would cut the corners of the boxes next to the one it points at. Else
    straight, or an arc above everything (``_arc``)."""
    (xa, ya), (xb, yb) = a, b
    if 0 < xb - xa <= COLUMN * 1.01 and abs(ya - yb) > 1e-9:
        if xa in alone:
            return "angle,angleA=90,angleB=0,rad=0", ((xa + xb) / 2, yb)
        if xb in alone:
            return "angle,angleA=0,angleB=90,rad=0", ((xa + xb) / 2, ya)
    rad = _arc(a, b, top, aspect)
    return f"arc3,rad={rad}", ((xa + xb) / 2 + rad * (yb - ya) / aspect / 2,
                               (ya + yb) / 2 - rad * (xb - xa) * aspect / 2)


def _aspect(ax):
    """How many times longer a data unit of `ax` is across than up, as it is laid out now."""
    (x0, y0), (x1, _), (_, y1) = ax.transData.transform([(0, 0), (1, 0), (0, 1)])
    return abs(x1 - x0) / max(abs(y1 - y0), 1e-9)


def _thread_text(labels, names, pid, tid):
    label = str(labels.get(pid, pid))
    if len(label) > 32:                   # a long command line: its end says the most
        label = "…" + label[-31:]
    return f"{label} (pid {pid})\n{names.get((pid, tid), f'thread {tid}')}"


COLUMN, ROW = 2.2, 1.3        # data units between two columns, two rows


def _layout(nodes, edges, cycle_nodes):
    """Positions: a cycle on a circle; everything else in columns (``_columns``), each column's
    nodes in the order of their neighbours', so most arrows run straight to the next column."""
    pos = {}
    rest = [k for k in nodes if k not in cycle_nodes]
    depth, back = _columns(rest, edges)
    before, after = {}, {}                     # each node's neighbours in earlier, later columns
    for a, b, _, _ in edges:
        if a in depth and b in depth and depth[a] < depth[b]:
            before.setdefault(b, []).append(a)
            after.setdefault(a, []).append(b)
    ends = {k for e in back for k in e}        # an end of an arrow that goes back goes on top:
    columns = {}                               # its arc runs above every column
    for k in rest:
        columns.setdefault(depth[k], []).append(k)
    row = {}

    def place(keys, neighbours):
        keys.sort(key=lambda k: (k not in ends, sum(row[n] for n in neighbours[k]) /
                                 len(neighbours[k]) if neighbours.get(k) else float("inf")))
        row.update((k, i) for i, k in enumerate(keys))
    for d in sorted(columns):                  # by those they come from, then by those they
        place(columns[d], before)              # point to, then again: most arrows run straight
    for d in sorted(columns, reverse=True)[1:]:
        place(columns[d], after)
    for d in sorted(columns)[1:]:
        place(columns[d], before)
    for k in rest:
        pos[k] = (COLUMN * depth[k], -ROW * row[k])
    if cycle_nodes:
        n = len(cycle_nodes)
        radius = max(1.4, 0.75 * n / math.pi * 1.6)
        cx = (max((x for x, _ in pos.values()), default=-COLUMN) + COLUMN + radius)
        cy = -radius
        for i, k in enumerate(cycle_nodes):
            angle = math.pi / 2 - 2 * math.pi * i / n
            pos[k] = (cx + 1.3 * radius * math.cos(angle), cy + radius * math.sin(angle))
    return pos


def _columns(rest, edges):
    """({node: its column}, {(a, b): the arrows that go back}) for the nodes `rest`.

    Waits can go round without anyone being stuck: between two batches a DataLoader's main
    thread waits for the data queue, which the workers put into, while they wait for their
    index queues, which the main thread puts into. A column "one past the longest path to it"
    has no answer on a round, so a walk from the node that must act for the most (a pipeline's
    main thread) first marks the arrows that close a round as going back; the rest is a longest
    path. A node nobody points to sits just before the first node it points to (a worker that
    is computing, and must put: beside the other workers, not beside the main thread)."""
    succ = {k: [] for k in rest}
    for a, b, _, _ in edges:
        if a in succ and b in succ and a != b and b not in succ[a]:
            succ[a].append(b)
    into = {k: 0 for k in rest}
    for a in rest:
        for b in succ[a]:
            into[b] += 1
    roots = sorted(rest, key=lambda k: (into[k] > 0, into[k] - len(succ[k])))
    back, seen = set(), {}                     # seen: 1 on the walk's path, 2 done
    for root in roots:
        if root in seen:
            continue
        seen[root], path = 1, [(root, iter(succ[root]))]
        while path:
            node, todo = path[-1]
            nxt = next(todo, None)
            if nxt is None:
                seen[node] = 2
                path.pop()
            elif seen.get(nxt) == 1:
                back.add((node, nxt))
            elif nxt not in seen:
                seen[nxt] = 1
                path.append((nxt, iter(succ[nxt])))
    ahead = [(a, b) for a in rest for b in succ[a] if (a, b) not in back]
    depth = {k: 0 for k in rest}
    for _ in range(len(rest)):                 # longest path, by repeated relaxation
        changed = False
        for a, b in ahead:
            if depth[b] < depth[a] + 1:
                depth[b] = depth[a] + 1
                changed = True
        if not changed:
            break
    pointed = {b for _, b in ahead}
    for k in rest:
        after = [depth[b] for a, b in ahead if a == k]
        if k not in pointed and after:
            depth[k] = min(after) - 1
    return depth, back
