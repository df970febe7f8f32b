"""One colour vocabulary for every mpviz picture: the legend *is* the lesson.

Dask's dashboard taught a generation of users that "red = you paid for a transfer". mpviz uses
the same idea for multiprocessing, and the same colour means the same thing in the timeline, the
memory map, the wait-for graph and the Live widget::

    green    shared: a handle travelled, the data stayed in shared memory
    red      you paid: bytes were copied (into shared memory, or pickled through a pipe)
    grey     an ordinary small message (torch's request for an fd too) / a process that ended
             normally
    orange   waiting (hatched): a thread blocked on a lock
    blue     holding a lock
    purple   leaked: a segment left in /dev/shm that no live process maps
    crimson  stuck for good: a deadlock, a cycle, a lock nobody can release
    amber    a warning (▼): the producer exited while a consumer held its CUDA memory
    magenta  ✗ an action that failed (a put or get that raised) or never finished (a write
             blocked for good on a full pipe in a process the watchdog found stuck)
    black    killed by a signal;  brown: exited with an error code

``COLORS`` maps a meaning to a colour, ``WORDS`` says each meaning in plain words (used by every
legend), and ``legend(ax, keys)`` draws a legend of the meanings a picture actually uses.
No matplotlib is imported here, so the words can be used anywhere (the widget's text panels).
"""

COLORS = {
    "handle": "#2ca02c",        # green: shared, only a handle travelled
    "copy": "#d62728",          # red: bytes copied / a big pickle through the pipe
    "message": "#7f7f7f",       # grey: an ordinary (small) pickled message
    "fd_request": "#7f7f7f",    # the same grey: torch's request for an fd (a small pickle too)
    "waiting": "#ff7f0e",       # orange, drawn hatched
    "blocked": "#b15928",       # dark orange-brown, drawn cross-hatched on a pale fill
    "holding": "#1f77b4",       # blue
    "leak": "#9467bd",          # purple
    "deadlock": "#a50f15",      # crimson
    "warning": "#ffc107",       # amber: a warning, not (yet) a failure
    "failed": "#c51b7d",        # magenta ✗: this action failed (its error written beside it)
    "task": "#ffffff",          # white box, dark edge: a Pool task running
    "task_failed": "#fcbba1",   # pink box, brown edge: a Pool task whose function raised
    "exit0": "#c7c7c7",         # light grey life bar: ended normally
    "exitcode": "#8c564b",      # brown: exited with an error code
    "signal": "#252525",        # black: killed by a signal
    "running": "#9ecae1",       # light blue: still running when the trace ends
    "fd": "#1b7837",            # dark green, dashed: an fd passed over a Unix socket
    "collective": "#3f007d",    # indigo: in a collective (torch's or mpviz's), all ranks there
    "collective_wait": "#807dba",   # lavender, hatched: in a collective, waiting for other ranks
    # (not teal: the mark() ticks are teal, and a rank's work steps are marks -- they looked
    # alike; purple is the memory map's "leaked" elsewhere, never on a timeline)
    "disagree": "#c51b7d",      # magenta line: ranks at the same collective number, other ops
    "mark": "#17becf",          # teal: your own mark() events
    "event": "#555555",         # dark grey ticks: other events
    "ghost": "#bdbdbd",         # a thread that does not exist where it is needed
    "mapped": "#a1d99b",        # light green: a process maps a segment
    "freed": "#f0f0f0",         # pale: freed / no longer there
}

WORDS = {
    "handle": "shared: only a handle travelled (data stayed in shared memory)",
    "copy": "you paid: bytes copied (into shared memory, or pickled through the pipe)",
    "message": "an ordinary small message (pickled)",
    "fd_request": "torch's request for an fd, to the sender's _serve (not a message)",
    "waiting": "waiting for a lock",
    "blocked": "blocked in a wait (join, get() on an empty queue, Event, a full pipe ...): the "
               "label says on what",
    "holding": "holding a lock",
    "leak": "leaked: left in /dev/shm, no live process maps it",
    "deadlock": "stuck for good (deadlock)",
    "warning": "warning: the producer exited while a consumer held its CUDA memory",
    "failed": "this action failed, or blocked for good (what, written beside it)",
    "task": "a Pool task running (start → done)",
    "task_failed": "a Pool task whose function raised (start → error)",
    "exit0": "process ran and exited normally (exit 0)",
    "exitcode": "process exited with an error code",
    "signal": "process killed by a signal",
    "running": "process still running when the trace ends",
    "mark": "your own mark() events",
    "event": "thin dark ticks: other recorded events (fd passed, memory mapped, ...)",
    "ghost": "a thread that does not exist in this process",
    "mapped": "this process maps the segment",
    "freed": "freed / gone",
    "collective": "in a collective or init_process_group once every rank arrived; the "
                  "vertical line joins the ranks at the last arrival",
    "collective_wait": "in a collective or init_process_group, waiting for the other ranks "
                       "to arrive (or, after they left it, for what never comes)",
    "disagree": "ranks that disagree: other operations at one collective number (the "
                "label says which)",
    "lost": "a message put and never got: no get was recorded before the trace ended",
    "fd": "dashed: an fd sent over a Unix socket (SCM_RIGHTS) for a handle; dotted: to its "
          "message",
}

BLOCKED_FILL = "#fdebd7"        # the pale fill under a blocked span's hatching

# Messages at least this big (pickled bytes) are drawn as a paid transfer (red).
BIG_MESSAGE = 64 * 1024



def legend(ax, keys, stuck_hatch=False, **kwargs):
    """Draw a legend on `ax` with the plain-words meaning of each key in `keys` (see ``WORDS``).
    `stuck_hatch`: the picture drew waits that are stuck for good hatched in crimson (the
    timeline's lock waits): the "deadlock" swatch shows that hatch in its frame; else the frame
    alone, as a stuck process's box and the wait-for graph's crimson outlines are drawn."""
    from matplotlib.patches import Patch
    handles = []
    for key in keys:
        if key == "waiting":
            handles.append(Patch(facecolor="white", edgecolor=COLORS[key], hatch="///",
                                 label=WORDS[key]))
        elif key == "deadlock":          # as drawn: a crimson frame (stuck waits hatched in it)
            handles.append(Patch(facecolor="white", edgecolor=COLORS[key], lw=2,
                                 hatch="///" if stuck_hatch else None, label=WORDS[key]))
        elif key == "collective_wait":
            handles.append(Patch(facecolor="white", edgecolor=COLORS[key], hatch="\\\\\\",
                                 label=WORDS[key]))
        elif key == "blocked":
            handles.append(Patch(facecolor=BLOCKED_FILL, edgecolor=COLORS[key], hatch="xx",
                                 label=WORDS[key]))
        elif key == "task":
            handles.append(Patch(facecolor="white", edgecolor="#333333", label=WORDS[key]))
        elif key == "task_failed":
            handles.append(Patch(facecolor=COLORS[key], edgecolor=COLORS["exitcode"],
                                 label=WORDS[key]))
        elif key == "warning":
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], marker="v", ls="none", ms=8, color=COLORS[key],
                                  markeredgecolor="#7a5200", label=WORDS[key]))
        elif key == "failed":
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], marker="X", ls="none", ms=8, color=COLORS[key],
                                  markeredgecolor="white", label=WORDS[key]))
        elif key == "disagree":          # as drawn: a vertical line across the ranks' lanes
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], marker="|", ls="none", ms=11, color=COLORS[key],
                                  markeredgewidth=2.2, label=WORDS[key]))
        elif key == "event":
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], marker="|", ls="none", ms=9, color=COLORS[key],
                                  markeredgewidth=1.0, label=WORDS[key]))
        elif key == "fd":
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], ls=(0, (3, 2)), lw=1.2, color=COLORS[key],
                                  label=WORDS[key]))
        elif key == "lost":
            from matplotlib.lines import Line2D
            handles.append(Line2D([], [], marker=">", ls="none", ms=6, color=COLORS["message"],
                                  label=WORDS[key]))

        elif key == "ghost":
            handles.append(Patch(facecolor="white", edgecolor=COLORS[key], linestyle="--",
                                 label=WORDS[key]))
        else:
            handles.append(Patch(facecolor=COLORS[key], edgecolor="none", label=WORDS[key]))
    options = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8,
                   borderaxespad=0.0)
    options.update(kwargs)
    return ax.legend(handles=handles, **options)
