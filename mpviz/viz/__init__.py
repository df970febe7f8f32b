"""Pictures of a recorded run (matplotlib): the timeline, the memory map, the wait-for graph.

    import mpviz.viz as viz
    viz.timeline(trace)                  # one lane per process: life, messages, copies, waits
    viz.memory_map(trace, at=None)       # processes × shared-memory segments: who maps, leaks
    viz.wait_for(trace, at=None)         # owner → lock → waiter; cycles and ghost owners in red
    viz.ring(trace, inputs)              # mpviz.distributed's ring all-reduce, step by step
    viz.state_at(trace, t_ns).text()     # the same facts in words, at one instant (no picture)
    viz.plot(result)                     # a scenario's Result: its pictures, one figure

Each function returns a ``matplotlib.figure.Figure`` (mpviz's subclass in ``figure.py``, which
a notebook shows as a picture even without ``%matplotlib inline``; made without pyplot, so
nothing pops up twice in a notebook and nothing needs closing; ``fig.savefig("x.png")`` saves it)
and takes ``ax=`` to draw into your own axes. One colour vocabulary everywhere: see
``colors.py`` (``COLORS``, ``WORDS``, ``legend``). ``import mpviz`` does not import this package
(or matplotlib); ``Trace.plot()`` does, and draws the timeline.

One module per picture; the analysis they share sits beside ``Trace``: mpviz/trace/analysis.py
(plain Python, testable).
"""
from ..trace.analysis import (Deadlock, Failure, LockState, Owner, ProcessState, SegmentState,
                              State, _index, busiest_moment, channel_names, deadlocks, failures,
                              lock_name, process_labels, state_at, stuck_moment,
                              torch_not_recorded, trace_span)
from ..trace.names import human_bytes
from ..trace.trace import UNKNOWN
from .colors import BIG_MESSAGE, COLORS, WORDS, legend
from .figure import Figure
from .memory_map import memory_map
from .ring import ring, ring_steps
from .timeline import timeline
from .wait_for import wait_for

__all__ = ["timeline", "memory_map", "wait_for", "ring", "ring_steps", "state_at", "plot",
           "summary", "COLORS", "WORDS", "legend", "human_bytes", "deadlocks", "stuck_moment", "trace_span",
           "process_labels", "State", "ProcessState", "SegmentState", "LockState", "Owner",
           "Deadlock", "BIG_MESSAGE", "Failure", "failures", "channel_names", "lock_name"]


def plot(obj, at=None):
    """A ``Result`` (or a ``Trace``): timeline on top, memory map and wait-for graph below,
    titled with the verdict (the scenario's name and outcome) and, under it, the start of the
    explanation (at most 3 lines of ~100 characters). Returns the Figure.

    A panel with nothing to show is left out, and the other takes the width: the wait-for
    graph when the run took no lock and nothing got stuck, the memory map when no shared memory
    was recorded. With `at` None, the memory map is drawn at the end if something is left there
    (a leak, a segment still mapped), else at the moment the most segments were mapped -- at
    the end of a clean run all are freed, and a map of white cells teaches nothing; its title
    says which instant it shows."""
    import textwrap

    trace = getattr(obj, "trace", obj)
    ix = _index(trace)
    panels = ([_map_panel(trace, at)] if ix.shm else []) + \
        ([lambda ax: wait_for(trace, at=at, ax=ax)]
         if ix.lock_infos or ix.waits or deadlocks(trace) else [])
    fig = Figure(figsize=(13, 11 if panels else 6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.2, 1]) if panels else (fig, None)
    timeline(trace, ax=top.add_subplot(), at=at)           # fig.axes[0]: the timeline
    if panels:
        for draw, sub in zip(panels, bottom.subfigures(1, len(panels)) if len(panels) > 1
                             else [bottom]):
            draw(sub.add_subplot())
    notes_under(fig, getattr(trace, "notes", ()))
    if hasattr(obj, "outcome"):
        title = f"{getattr(obj, 'name', '') or 'run'}: {str(obj.outcome).upper()}"
        words = " ".join(str(obj.explanation or "").split())
        lines = textwrap.wrap(words, 100, max_lines=3, placeholder=" …")
        fig.suptitle("\n".join([title] + lines), x=0.01, ha="left", fontsize=10,
                     linespacing=1.4)
    return fig


def notes_under(fig, notes, most=5):
    """Under `fig`, in red, what could not be recorded (``Trace.notes``): a picture is believed,
    so one that is missing something says so on itself, not only on the terminal. (Saved with
    ``bbox_inches="tight"``, as a notebook shows it, the lines are inside the image.) Once per
    figure: a second call adds nothing."""
    import textwrap
    if not notes or any(t.get_gid() == "not recorded" for t in fig.texts):
        return                           # (once: timeline() and wait_for() write them too)
    lines = [textwrap.shorten(f"NOT RECORDED: {n}", 220) for n in notes[:most]]
    if len(notes) > most:
        lines.append(f"... and {len(notes) - most} more (mpviz.trace.load(DIR).notes)")
    fig.text(0.01, 0.0, "\n".join(lines), color="#b00000", fontsize=8, va="top", ha="left",
             gid="not recorded")


def _map_panel(trace, at):
    """How plot draws the memory map: at `at`, or (None) at the end -- unless everything was
    freed by then, in which case at the moment the most was mapped, and the title says so."""
    ix = _index(trace)
    map_at, title = at, None
    if at is None:
        end = ix.segment_states(ix.t1)
        busiest = busiest_moment(trace)
        if end and busiest is not None and all(s.status == "freed" for s in end):
            map_at = busiest
            # short lines: the panel can be narrow, and its title must not run into the
            # wait-for graph's beside it
            title = (f"Who maps which shared-memory segment\nat "
                     f"{(busiest - ix.t0) / 1e6:.1f} ms, when the most were mapped\n"
                     f"(by the end {'it was' if len(end) == 1 else f'all {len(end)} were'}"
                     f" freed: nothing leaked)")
    return lambda ax: memory_map(trace, at=map_at, ax=ax, title=title)


def summary(trace):
    """The run in words: processes, messages (handles vs copies), segments, deadlocks, and
    what it lost without a word (``trace.lost_work``)."""
    st = state_at(trace)
    flows = trace.flows()
    handles = _index(trace).handles
    copies = trace.of_kind("copy")
    segs = st.segments
    carried = [handles[f.put.args["msg"]] for f in flows if f.put.args.get("msg") in handles]
    ran = [p for p in trace.processes() if p.how not in ("launcher", "watchdog")]  # not mpviz's
    # where torch's sharing could not be seen, its counts are unknown: never say "0" for them
    notes = list(getattr(trace, "notes", ()))
    blind = " (torch's: unknown, NOT recorded)" if torch_not_recorded(trace) else ""
    if not blind and any(UNKNOWN in n for n in notes):     # a part of the run is missing
        blind = " + unknown (NOT RECORDED below)"
    # ... and its messages too (a program run with -I; torch.distributed's collectives), unless
    # only torch's sharing is missing: the messages that carried it were recorded
    missing = " + unknown (NOT RECORDED below)" if any(
        UNKNOWN in n and "torch's shared memory" not in n for n in notes) else ""
    lines = [f"{len(ran)} processes, {len(trace.events)} events",
             f"{len(flows)} messages{missing}: {len(carried)} carried shared-memory "
             f"handles{blind} "
             f"({sum(carried)} in all, as their senders counted them); "
             f"{len(copies)} copies into shared memory "
             f"({human_bytes(sum(e.args.get('nbytes') or 0 for e in copies))}){blind}",
             f"{len(segs)} segments{blind}; leaked: {sum(s.status == 'leaked' for s in segs)}"
             + (f"; maybe in flight in a queue (not got yet): "
                f"{sum(s.status == 'in flight?' for s in segs)}"
                if any(s.status == "in flight?" for s in segs) else "")]
    lines += _torch_lines(trace) + _heap_lines(trace)
    lines += [f"NOT RECORDED: {line}" for line in notes
              if "torch's shared memory" not in line]          # (torch's: said just above)
    lines += [f"STUCK: {d.reason}" for d in deadlocks(trace)]
    # what a run that ended well lost without a word (record()'s end, `mpviz trace`'s)
    lines += [f"LOST: {line}" for line in getattr(trace, "lost_work", ())]
    return "\n".join(lines)


def _torch_lines(trace):
    """Real torch's part of the summary: what was seen, and what cannot be."""
    if torch_not_recorded(trace):
        return ["NOT RECORDED: " + torch_not_recorded(trace)]
    made = [e for e in trace.of_kind("shm.create") if e.args.get("torch")]
    if not made:
        return []
    fds = [e for e in trace.of_kind("fd.recv") if e.args.get("torch")]
    hits = [e for e in trace.of_kind("shm.cache") if e.args.get("torch") and e.args.get("hit")]
    nbytes = human_bytes(sum(e.args["nbytes"] for e in made))
    return [f"torch: {len(made)} segments made ({nbytes}), {len(fds)} fds handed over"
            f"{_requests_words(trace)}, {len(hits)} receive-cache hits; torch's unmaps are read "
            f"from /proc/PID/maps (a few segments behind at most), its unlinks are not seen"]


def _requests_words(trace):
    """How the fds were asked for, when the trace records the requests with the hand-overs
    (not as messages: an older trace counts them among the messages, and this says nothing)."""
    sizes = sorted(r.nbytes for r in _index(trace).fd_requests if r.nbytes is not None)
    if not sizes:
        return ""
    each = human_bytes(sizes[0]) if sizes[0] == sizes[-1] else \
        f"{human_bytes(sizes[0])}–{human_bytes(sizes[-1])}"
    return (f" ({len(sizes)} asked for by a request of {each} to the sender's resource_sharer "
            f"thread: hand-overs, not counted among the messages)")


def _heap_lines(trace):
    """sharedctypes (Value, Array): the stdlib heap's arenas, and who mapped them."""
    made = [e for e in trace.of_kind("shm.create") if e.args.get("via") == "multiprocessing.heap"]
    if not made:
        return []
    names = {e.args.get("name") for e in made}
    mappers = {e.pid for e in trace.of_kind("shm.create", "shm.attach")
               if e.args.get("name") in names}
    nbytes = human_bytes(sum(e.args.get("nbytes") or 0 for e in made))
    return [f"sharedctypes (Value, Array): {len(made)} heap arena{'s' * (len(made) > 1)} "
            f"({nbytes}) in shared memory, mapped by {len(mappers)} processes"]
