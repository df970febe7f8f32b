"""The pictures (issue #5), drawn from real recorded traces and checked by what they contain.

Four real runs are recorded once per module: tensors through a queue (producer/consumer), a
file_system segment leaked by a SIGKILLed holder, a lock copied by fork while a thread held it,
and two processes that take two locks in opposite order. Each test then asserts on the figure's
artists (lanes, arrows and their colours, red cycles, the words written), not only that it ran.
"""
import os
import subprocess
import sys
import threading

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import viz_workers as w  # noqa: E402

import mpviz.multiprocessing as mp  # noqa: E402
import mpviz.trace as mt  # noqa: E402
from mpviz import viz  # noqa: E402
from mpviz.viz import COLORS, WORDS  # noqa: E402
from mpviz.trace import analysis as st  # noqa: E402

pytestmark = pytest.mark.timeout(120)


# --- the recorded runs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pc():
    """Producer/consumer under spawn: 3 tensors (copied into shm once), one re-sent, one plain
    NumPy array (pickled whole), the end marker; the consumer sends back a total."""
    ctx = mp.get_context("spawn")
    with mt.record() as trace:
        q, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
        prod = ctx.Process(target=w.producer, args=(q, 3, 100_000, done, 20_000),
                           name="producer")
        cons = ctx.Process(target=w.consumer, args=(q, results, done), name="consumer")
        prod.start()
        cons.start()
        total = results.get()
        prod.join()
        cons.join()
        for queue in (q, results):
            queue.close()
            queue.join_thread()
    assert total == 3 * 100_000 + 20_000
    return trace, prod.pid, cons.pid


@pytest.fixture(scope="module")
def leak():
    """file_system strategy, shm manager off: the holder is SIGKILLed holding its segment."""
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    mp.set_shm_manager(False)
    try:
        ctx = mp.get_context("fork")
        with mt.record() as trace:
            names = ctx.Queue()
            holder = ctx.Process(target=w.leaky_holder, args=(names,), name="holder")
            holder.start()
            name = names.get()
            holder.join()
            names.close()
            names.join_thread()
    finally:
        mp.set_shm_manager(True)
        mp.set_sharing_strategy(old)
    leaked_on_disk = os.path.exists("/dev/shm/" + name.lstrip("/"))
    if leaked_on_disk:
        os.unlink("/dev/shm/" + name.lstrip("/"))   # the picture keeps the lesson; we clean up
    return trace, holder.pid, name, leaked_on_disk


@pytest.fixture(scope="module")
def fork_deadlock():
    """A helper thread holds a threading.Lock while the main thread forks; the child blocks."""
    ctx = mp.get_context("fork")
    with mt.record(threading_locks=True) as trace:
        lock = threading.Lock()
        helper, done = w.hold_in_a_thread(lock)
        child = ctx.Process(target=w.take, args=(lock,), name="forked child")
        child.start()
        done.set()
        helper.join()
        while not [e for e in trace.of_kind("lock.wait") if e.pid == child.pid]:
            trace.refresh()                 # synchronised on the log: the child is blocked
            assert child.is_alive()
        child.kill()
        child.join()
    return trace, child.pid


@pytest.fixture(scope="module")
def cycle():
    """A takes L1 then L2, B takes L2 then L1: a cycle."""
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        l1, l2 = ctx.Lock(), ctx.Lock()
        ready_a, ready_b, go = ctx.Event(), ctx.Event(), ctx.Event()
        a = ctx.Process(target=w.cross, args=(l1, l2, ready_a, go), name="A")
        b = ctx.Process(target=w.cross, args=(l2, l1, ready_b, go), name="B")
        a.start()
        b.start()
        assert ready_a.wait(30) and ready_b.wait(30)
        go.set()
        while len([e for e in trace.of_kind("lock.wait") if e.pid in (a.pid, b.pid)]) < 2:
            trace.refresh()
        a.kill()
        b.kill()
        a.join()
        b.join()
    return trace, a.pid, b.pid


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded(pc, leak, fork_deadlock, cycle):
    """Draw every picture once before the tests: matplotlib opens (and keeps open) a font file
    the first time it needs it, which the per-test leak check would otherwise count."""
    import io
    for trace in (pc[0], leak[0], fork_deadlock[0], cycle[0]):
        for fig in (viz.timeline(trace), viz.memory_map(trace, check_os=True),
                    viz.wait_for(trace), viz.plot(trace), viz.timeline(trace, fast=True)):
            fig.savefig(io.BytesIO(), format="png")


def texts(fig):
    """Every word the figure shows, after a draw (labels that found no room are hidden)."""
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        out += [t.get_text() for t in ax.texts if t.get_visible()]
        out += [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels()]
        out.append(ax.get_title(loc="left"))
        if ax.get_legend():
            out += [t.get_text() for t in ax.get_legend().get_texts()]
    return out


def arrows(fig, gid=None):
    """The message arrows (put -> get); with gid="fd", the fd hand-overs' dashed arrows."""
    return [p for ax in fig.axes for p in ax.patches
            if isinstance(p, FancyArrowPatch) and p.get_gid() == gid]


# --- timeline ----------------------------------------------------------------------------------

def test_timeline_lanes_arrows_and_copies(pc):
    trace, prod, cons = pc
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels()]
    assert lanes[0].startswith("main")
    assert f"producer\npid {prod} · spawn" in lanes and f"consumer\npid {cons} · spawn" in lanes
    assert "└ QueueFeederThread" in lanes                      # a thread sub-lane

    done = [f for f in trace.flows() if f.get is not None]
    drawn = arrows(fig)
    assert len(drawn) == len(done) == 7        # 3 tensors, 1 re-sent, the array, None, total
    fds = st.fd_passes(trace)                  # file_descriptor: each fd the consumer fetched
    assert fds and len(arrows(fig, "fd")) == len(fds)
    assert all(st.fd_message(trace, got) is not None for _, got in fds)
    colors = [to_hex(a.get_edgecolor()) for a in drawn]
    assert colors.count(COLORS["handle"]) == 4                  # tensors: handles
    assert colors.count(COLORS["copy"]) == 1                    # the NumPy array: 157 KiB pickled
    by_color = {c: a.get_linewidth() for c, a in zip(colors, drawn)}
    assert by_color[COLORS["copy"]] > by_color[COLORS["handle"]]  # width grows with bytes
    words = texts(fig)
    big = max(f.nbytes for f in done)                           # the pickled array ...
    assert 160_000 < big < 161_000                              # ... 20,000 float64 + pickle's own
    assert any(viz.human_bytes(big) in t for t in words)        # its size, written on the arrow
    assert any(t.startswith("copy 391 KiB") or " copies, " in t for t in words)  # into shm
    copies = [c for c in ax.collections if c.get_offsets().shape[0] == 3 and
              to_hex(c.get_facecolor()[0]) == COLORS["copy"]]
    assert copies, "three red squares, one per tensor copied into shared memory"
    for key in ("handle", "copy", "exit0"):
        assert WORDS[key] in words                              # the legend, in plain words


def test_timeline_squeezes_a_stretch_where_nothing_was_recorded():
    # A spawned child sleeps 0.6 s before it ends while main sleeps too (a sleep is no recorded
    # wait): for that long nothing at all is recorded, far over the 20 ms the squeeze needs. (This
    # used to lean on spawn's start-up, which became too short to be sure of.)
    import time
    ctx = mp.get_context("spawn")
    with mt.record() as trace:
        child = ctx.Process(target=time.sleep, args=(0.6,), name="sleeper")
        child.start()
        time.sleep(0.9)
        child.join()
    assert child.exitcode == 0
    fig = viz.timeline(trace)
    assert "nothing recorded there, squeezed" in fig.axes[0].get_xlabel()   # not "idle"
    flat = viz.timeline(trace, compress_idle=False)
    assert "squeezed" not in flat.axes[0].get_xlabel()


def test_timeline_marks_the_deadlocked_process_in_red(fork_deadlock):
    trace, child = fork_deadlock
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    red = [t.get_text() for t in ax.get_yticklabels() if to_hex(t.get_color()) ==
           COLORS["deadlock"]]
    assert red == [f"forked child\npid {child} · fork"]
    reason = [t for t in ax.texts if t.get_text().startswith("STUCK FOR GOOD")]
    assert reason and "fork copied the lock but not that thread" in \
        reason[0].get_text().replace("\n", " ")
    assert any(t == "SIGKILL" for t in (x.get_text().strip() for x in ax.texts))


def test_large_trace_is_aggregated_and_fast_enough():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import bench_timeline
    trace = mt.Trace(None, events=bench_timeline.synthetic_events(100_000))
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    assert any("bundles" in t.get_text() for t in ax.texts)       # arrows bundled
    assert len(ax.patches) < 200 and len(ax.images) == 1           # dense parts painted
    # the 1 s target is measured by bench/bench_timeline.py on a quiet machine; here only
    # that nothing is drawn per event (a per-event drawing takes tens of seconds)
    wall, _ = bench_timeline.draw_once(bench_timeline.synthetic_events(100_000))
    assert wall < 10


# --- memory map --------------------------------------------------------------------------------

def test_memory_map_shows_the_leak(leak):
    trace, holder, name, leaked_on_disk = leak
    assert leaked_on_disk, "the segment really was left in /dev/shm"
    fig = viz.memory_map(trace)
    words = texts(fig)
    assert "LEAKED" in words
    assert any(t.startswith(name.lstrip("/")[:20]) and "file_system" in t for t in words)
    assert "created · died holding it" in words
    assert any("killed: SIGKILL" in t for t in words)
    assert "1 leaked" in fig.axes[0].get_title(loc="left")
    purple = [p for p in fig.axes[0].patches if to_hex(p.get_facecolor()) == COLORS["leak"]]
    assert len(purple) == 1
    (seg,) = viz.state_at(trace).segments
    assert (seg.status, seg.created_by, seg.died_holding) == ("leaked", holder, (holder,))


def test_memory_map_before_the_kill_and_os_check(leak, pc):
    trace, holder, name, _ = leak
    created = next(e for e in trace.events if e.kind == "shm.create")
    fig = viz.memory_map(trace, at=created.ts_ns)
    assert "in use" in texts(fig) and "LEAKED" not in texts(fig)
    checked = viz.memory_map(trace, check_os=True)        # we removed it: not in /dev/shm now
    assert any("not in /dev/shm now" in t for t in texts(checked))
    pc_trace, prod, cons = pc
    states = viz.state_at(pc_trace).segments
    assert len(states) == 3 and all(s.status == "freed" for s in states)  # fd: freed at exit
    assert all(s.created_by == prod and cons in s.mapped_ever for s in states)


# --- wait-for graph ----------------------------------------------------------------------------

def test_wait_for_draws_the_fork_ghost(fork_deadlock):
    trace, child = fork_deadlock
    fig = viz.wait_for(trace)
    ax = fig.axes[0]
    ghost = [t for t in ax.texts if "does not exist in forked child" in t.get_text()]
    assert len(ghost) == 1 and ghost[0].get_bbox_patch().get_linestyle() == "--"
    assert "'helper'" in ghost[0].get_text()
    title = ax.get_title(loc="left").replace("\n", " ")
    assert "fork copied the lock but not that thread" in title
    (d,) = viz.deadlocks(trace)
    assert d.pid == child and d.cycle == ()
    (lk,) = viz.state_at(trace, viz.stuck_moment(trace)).locks
    assert lk.copy_in == child and lk.owners[0].ghost and lk.waiters[0][0] == child


def test_wait_for_draws_a_cycle_in_red(cycle):
    trace, a, b = cycle
    fig = viz.wait_for(trace)
    red = [p for p in arrows(fig) if to_hex(p.get_edgecolor()) == COLORS["deadlock"]]
    assert len(red) == 4                       # A holds L1 → B, B holds L2 → A
    words = texts(fig)
    assert {f"A (pid {a})\nmain thread", f"B (pid {b})\nmain thread"} <= set(words)
    found = viz.deadlocks(trace)
    assert {d.pid for d in found} == {a, b} and all(d.cycle for d in found)
    assert "a cycle" in fig.axes[0].get_title(loc="left")


def test_wait_for_with_nothing_waiting(pc):
    trace, _, _ = pc
    fig = viz.wait_for(trace, at=max(e.ts_ns for e in trace.events))  # the end: all done
    assert any("No thread is waiting" in t for t in texts(fig))


def test_wait_for_with_no_instant_shows_the_busiest_wait(pc):
    # main joins the producer, the producer waits for `done`: drawn, not "nobody waits"
    trace, _, _ = pc
    fig = viz.wait_for(trace)
    assert not any("No thread is waiting" in t for t in texts(fig))


# --- state, conveniences -----------------------------------------------------------------------

def test_state_at_messages_in_flight(pc):
    trace, prod, cons = pc
    first = next(f for f in trace.flows() if f.put.pid == prod)
    mid = viz.state_at(trace, first.put.ts_ns)
    assert first in mid.in_flight and {prod, cons} <= set(mid.alive())
    assert "Messages in flight (1)" in mid.text()
    end = viz.state_at(trace)
    assert end.in_flight == () and prod not in end.alive()
    assert viz.process_labels(trace)[prod] == "producer"


def test_plot_summary_and_trace_plot(pc, fork_deadlock):
    trace, _, _ = pc
    assert trace.plot().axes                                     # Trace.plot() → timeline
    fig = viz.plot(fork_deadlock[0])
    assert len(fig.axes) == 2          # timeline and wait-for: no shared memory, no empty map
    text = viz.summary(trace)
    assert "4 carried shared-memory handles" in text and "3 copies" in text


def test_labels_never_overlap_and_figures_show_in_a_notebook(pc):
    fig = viz.timeline(pc[0])
    png = fig._repr_png_()                       # what IPython shows without %matplotlib inline
    assert png.startswith(b"\x89PNG")
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts
             if t.get_visible() and t.get_text().strip()]
    assert len(boxes) >= 4
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1:])


def test_plot_title_is_short_and_sizes_are_binary(pc):
    class Result:                                # what a scenario returns, in miniature
        name, outcome, trace = "queue-sharing", "ok", pc[0]
        explanation = "word " * 120
    fig = viz.plot(Result())
    lines = fig._suptitle.get_text().splitlines()
    assert lines[0] == "queue-sharing: OK" and len(lines) <= 4
    assert all(len(line) <= 102 for line in lines)
    assert viz.human_bytes(64 * 1024) == "64 KiB" and viz.human_bytes(3 << 20) == "3 MiB"
    assert viz.human_bytes(512) == "512 B"


def test_cuda_warning_is_amber_not_a_deadlock():
    assert COLORS["warning"] != COLORS["deadlock"]
    assert "CUDA" in WORDS["warning"] and "deadlock" not in WORDS["warning"]


def test_scenario_lanes_watchdog_and_cuda():
    import mpviz.scenarios as sc
    r = sc.run("fork-held-lock")                  # run under a watchdog, which kills it
    lanes = [t.get_text() for t in viz.timeline(r.trace).axes[0].get_yticklabels()]
    assert not any("watchdog" in lane for lane in lanes)          # no lane for its side log
    assert lanes[0].startswith("main\npid ")                     # the driver, named once
    assert not any(lane.count("pid ") > 1 for lane in lanes)
    r = sc.run("cuda-producer-exits")
    fig = viz.timeline(r.trace)
    assert COLORS["handle"] in [to_hex(a.get_edgecolor()) for a in arrows(fig)]  # the handle
    marker = [ln for ln in fig.axes[0].lines if ln.get_marker() == "v"]
    assert marker and to_hex(marker[0].get_color()) == COLORS["warning"]
    assert WORDS["warning"] in texts(fig) and WORDS["deadlock"] not in texts(fig)


def test_import_mpviz_pulls_in_no_drawing_library():
    code = ("import sys, mpviz, mpviz.multiprocessing, mpviz.trace; "
            "bad = [m for m in ('matplotlib', 'ipywidgets') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr or done.stdout


def test_a_program_with_many_processes_gets_the_telling_lanes_and_says_what_it_left_out():
    # 50 forked children, one of which exits 3: the picture keeps it (and main), draws at most
    # MAX_PROCESS_LANES processes, and its title says how many were left out and how they ended.
    import sys as _sys
    import importlib
    tl = importlib.import_module("mpviz.viz.timeline")
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        kids = [ctx.Process(target=_sys.exit, args=(3 if i == 37 else 0,), name=f"kid{i}")
                for i in range(50)]
        for k in kids:
            k.start()
        for k in kids:
            k.join()
    assert [k.exitcode for k in kids].count(3) == 1
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    lanes = [t.get_text() for t in ax.get_yticklabels() if "pid" in t.get_text()]
    assert len(lanes) == tl.MAX_PROCESS_LANES
    assert any(f"pid {kids[37].pid}" in t for t in lanes)           # the one that failed
    assert any(f"pid {os.getpid()}" in t for t in lanes)            # the program's own
    title = ax.get_title(loc="left").replace("\n", " ")
    assert "51 processes: 40 drawn" in title and "11 more left out" in title
    assert "all ended normally" in title


def _get_one(q):
    q.get()


def test_a_message_got_by_a_process_left_out_is_not_drawn_as_never_got():
    # 50 forked children each get one item main put: the 11 children left out of the picture
    # did get theirs, so no ▸ ("put and never got") may stand on main's lane for those items.
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        q = ctx.Queue()
        kids = [ctx.Process(target=_get_one, args=(q,)) for _ in range(50)]
        for k in kids:
            k.start()
        for i in range(50):
            q.put(i)
        for k in kids:
            k.join()
        q.close()
        q.join_thread()
    assert all(k.exitcode == 0 for k in kids)
    assert not [f for f in trace.flows() if f.get is None]        # every item was got
    fig = viz.timeline(trace)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts] + [t.get_text() for t in fig.texts]
    assert not any("never got" in t for t in texts), texts
    assert not [ln for ln in ax.lines if ln.get_marker() == ">"]


def test_a_lock_wait_drawn_stuck_is_not_in_the_legend_as_an_ordinary_wait():
    # fork-held-lock's only lock wait is the child's, stuck for good (drawn crimson): the legend
    # says "stuck for good" and must not list the orange "waiting for a lock", drawn nowhere.
    import mpviz.scenarios as sc
    from mpviz.viz.colors import WORDS as words
    seen = texts(viz.timeline(sc.run("fork-held-lock").trace))
    assert words["deadlock"] in seen
    assert words["waiting"] not in seen
