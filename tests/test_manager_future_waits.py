"""A Manager's proxies and an executor's futures in a hang's verdict (issue 27): who waits for
whom, through the Manager's server process and through an executor's workers.

Programs written as their authors would (tests/hang_programs/), run through
``python -m mpviz trace --hang-after 1.5``, all at once, each judged alone:

    manager_queue_no_sentinel.py   a worker reads a Manager's Queue until None; the parent
                                   forgot q.put(None) and joins it
    manager_event_never_set.py     workers wait on a Manager's Event nobody sets
    executor_task_waits_lock.py    a ProcessPoolExecutor task waits for a lock the parent
                                   holds; the parent waits on fut.result()
    executor_reads_manager_queue.py  a ProcessPoolExecutor task reads a Manager's Queue that
                                   nobody fills
    thread_pool_gate_held.py       a ThreadPoolExecutor task waits for a lock the main thread
                                   holds
    resize_as_completed.py         as_completed() over 3 ProcessPoolExecutor tasks, each of
                                   which waits for a lock the parent holds
    fastest_mirror.py              wait(..., FIRST_COMPLETED) on 3 ThreadPoolExecutor tasks,
                                   inside `with cache_lock:` -- which each task takes
    one_worker_pipeline.py         a task of a one-thread ThreadPoolExecutor submits the next
                                   stage to it and waits: queued behind itself

What must be said: a Manager's server process is the Manager's machinery -- its polling loop
(serve_forever wakes each second) can end no wait of the program, so the verdict is a DEADLOCK,
not "unless a loop gives up by itself"; a get() through a proxy names the Manager's queue, the
server that keeps it and who must put; a future's result() names the task and the worker (or
thread) that runs it, and what that one waits for; an executor's idle worker is idle.
"""
import multiprocessing
import os
import re

import pytest

import mpviz.trace as mt
from mpviz.trace import analysis as st
from test_hang_classes import hung, result, together

# The programs use the default start method: fork before 3.14, forkserver from 3.14 on
FORK = multiprocessing.get_start_method() == "fork"
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_programs")
NAMES = ("manager_queue_no_sentinel.py", "manager_event_never_set.py",
         "executor_task_waits_lock.py", "executor_reads_manager_queue.py",
         "thread_pool_gate_held.py", "resize_as_completed.py", "fastest_mirror.py",
         "one_worker_pipeline.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{program: result} of every program above, each under its own launcher, all at once."""
    return together(tmp_path_factory, {name: ("1.5", os.path.join(PROGRAMS, name))
                                       for name in NAMES})


def _waits(err):
    """The verdict's who-waits-for-whom lines."""
    return err.split("Who waits for whom", 1)[-1]


@pytest.mark.timeout(150)
def test_a_managers_polling_loop_is_not_taken_for_a_loop_that_may_end_the_hang(runs):
    # Said before: "DEADLOCK, unless a loop gives up by itself ... Only the polling loop of
    # SyncManager-1 (pid ...)'s main thread can still end this" -- the Manager's serve_forever.
    for name in ("manager_queue_no_sentinel.py", "manager_event_never_set.py"):
        err = hung(result(runs, name))
        assert "unless a loop gives up by itself" not in err, err
        assert "polling loop" not in err, err
        assert re.search(r"HANG: DEADLOCK -- .*nobody can ever move\. \(SyncManager-1 \(pid "
                         r"\d+\): the Manager server process, which keeps the Manager's "
                         r"objects", err), err
        assert re.search(r"SyncManager-1 \(the Manager's server process, pid \d+\), main "
                         r"thread: ", err), err


@pytest.mark.timeout(150)
def test_a_get_through_a_managers_queue_names_the_queue_its_server_and_who_must_put(runs):
    err = hung(result(runs, "manager_queue_no_sentinel.py"))
    assert re.search(r"  Process-2's main thread waits: get\(\) on the Manager's Queue 1 "
                     r"\(kept in SyncManager-1, pid \d+\): nothing in it -- "
                     r"manager_queue_no_sentinel\.py's main thread must put\n", _waits(err)), err
    assert "main thread waits: join Process-2" in err, err


@pytest.mark.timeout(150)
def test_a_managers_event_nobody_sets_is_said_so_for_each_waiting_worker(runs):
    waits = _waits(hung(result(runs, "manager_event_never_set.py")))
    for worker in ("Process-2", "Process-3"):
        assert re.search(rf"  {worker}'s main thread waits: wait\(\) on the Manager's Event 1 "
                         rf"\(kept in SyncManager-1, pid \d+\): it is not set -- someone must "
                         rf"call its set\(\), and no thread the trace recorded has called it "
                         rf"yet", waits), waits


@pytest.mark.timeout(150)
def test_a_futures_result_names_the_task_and_the_worker_that_runs_it_and_its_wait(runs):
    # Said before: "a future's result -- who must act is not recorded", and the idle worker
    # as "get() on Queue 1: nothing in it yet -- futs.py's Thread-1 must put".
    err = hung(result(runs, "executor_task_waits_lock.py"))
    waits = _waits(err)
    found = re.search(r"  executor_task_waits_lock\.py's main thread waits: the result of "
                      r"task\(3\) -- ((?:Fork|ForkServer)Process-\d)'s main thread runs it and must finish it "
                      r"\(it waits for lock '\w+', held by executor_task_waits_lock\.py's main "
                      r"thread\)", waits)
    assert found, err
    assert "who must act is not recorded" not in waits, err
    if FORK:       # (under forkserver, 3.14's default, workers start on demand: one here)
        idle = {"ForkProcess-1", "ForkProcess-2"} - {found.group(1)}
        assert f"  {idle.pop()} is idle, not stuck: it waits for its next task from the " \
               f"ProcessPoolExecutor" in waits, err
    assert "nothing in it yet" not in waits, err


@pytest.mark.timeout(150)
def test_a_future_waited_for_by_the_thread_that_holds_its_tasks_lock_is_one_cycle(runs):
    """The main thread waits for task(3)'s result; the worker running it waits for the lock
    the main thread holds: one cycle, said and drawn as one (said before: two lines, each
    true, and no STUCK FOR GOOD -- the learner had to close the circle; the picture drew the
    future's node off the circle)."""
    import importlib
    wait_for = importlib.import_module("mpviz.viz.wait_for")   # (viz.wait_for: the function)
    run = hung(result(runs, "executor_task_waits_lock.py"))
    found = re.search(
        r"  STUCK FOR GOOD: a cycle: executor_task_waits_lock\.py's main thread waits for the "
        r"result of task\(3\), which ((?:Fork|ForkServer)Process-\d)'s main thread runs; \1's "
        r"main thread waits for lock '(?:l|lock)', which executor_task_waits_lock\.py's main "
        r"thread holds\. Each waits for the next: none can go on", _waits(run))
    # (the name the waiter calls it by: under fork the worker's __main__ holds the parent's
    # `l` too; under forkserver, 3.14's default, only the initializer's global `lock`)
    assert found, run
    folder = re.search(r"recording into (\S+) ", run).group(1)
    trace = mt.load(folder)
    state = st.state_at(trace, st.stuck_moment(trace))
    _, _, circle, dead = wait_for._graph(state)
    assert [k[0] for k in circle] == ["thread", "lock", "thread", "lock"], circle
    assert any(str(k[1]).startswith("future:") for k in circle), circle
    assert len(dead) == 2, dead


@pytest.mark.timeout(150)
def test_a_task_that_reads_a_managers_queue_nobody_fills_is_one_chain(runs):
    err = hung(result(runs, "executor_reads_manager_queue.py"))
    waits = _waits(err)
    assert re.search(r"  ((?:Fork|ForkServer)Process-\d)'s main thread waits: get\(\) on the Manager's Queue 1 "
                     r"\(kept in SyncManager-1, pid \d+\): nothing in it -- someone must call "
                     r"its put\(\), and no thread the trace recorded has called it yet",
                     waits), waits
    assert re.search(r"executor_reads_manager_queue\.py's main thread waits: the result of "
                     r"consume\(\.\.\.\) -- (?:Fork|ForkServer)Process-\d's main thread runs it and must finish "
                     r"it \(it waits: get\(\) on the Manager's Queue 1", waits), waits
    if FORK:
        assert re.search(r"ForkProcess-\d is idle, not stuck", waits), waits


@pytest.mark.timeout(150)
def test_a_thread_pools_future_names_the_thread_that_runs_its_task(runs):
    err = hung(result(runs, "thread_pool_gate_held.py"))
    waits = _waits(err)
    assert "  thread_pool_gate_held.py's main thread waits: the result of fetch('a.csv') -- " \
           "thread_pool_gate_held.py's ThreadPoolExecutor-0_0 runs it and must finish it" \
           in waits, waits
    # one process, no fork: "Fix: start the children with 'spawn' ..." was said, and was false
    assert "its threads wait for each other" in err, err
    assert "spawn" not in err and "fork" not in err, err


@pytest.mark.timeout(150)
def test_a_managers_server_is_never_who_must_put_into_a_queue_of_the_program(runs):
    # A forked executor worker increfs its inherited proxies as it starts: one connection to
    # the Manager, the only pipe it has read when it waits for work -- taken before for its
    # call queue's pipe, so the wait-for graph drew the Manager's threads as "must put" into
    # the executor's call queue, and the server as STUCK FOR GOOD.
    err = hung(result(runs, "executor_reads_manager_queue.py"))
    trace = mt.load(re.search(r"recording into (\S+) \(", err).group(1))
    state = st.state_at(trace, st.stuck_moment(trace))
    servers = st.manager_servers(trace)
    assert servers, err
    if FORK:                     # (forkserver: no idle worker to take for the Manager's)
        idle = [b for b in state.blocked if b.on == "queue.get"]
        # (the idle worker's get may find the task the other worker then takes first: then
        # no wait of its is recorded -- 1 run of 3.13's whole suite -- and the verdict knows
        # it idle by its stack)
        assert idle or re.search(r"ForkProcess-\d is idle, not stuck", err), (state.blocked, err)
    for b in state.blocked:
        assert not any(pid in servers for pid, _ in b.waits_for), (b, servers)
    assert not any(d.pid in servers for d in state.deadlocks), state.deadlocks


@pytest.mark.timeout(150)
def test_as_completed_names_its_tasks_who_runs_them_and_what_they_wait_for(runs):
    # Said before: "resize_all.py's main thread waits: as_completed -- who must act is not
    # recorded", and no cycle.
    waits = _waits(hung(result(runs, "resize_as_completed.py")))
    worker = r"(?:Fork|ForkServer)Process-\d's main thread"
    assert re.search(
        rf"  resize_as_completed\.py's main thread waits: as_completed\(\) over 3 futures: "
        rf"resize\('a\.png'\), resize\('b\.png'\) and resize\('c\.png'\) -- {worker}"
        rf"(?: and {worker})? runs? (?:it|them), and one must finish \((?:it|each) waits for "
        rf"lock 'log_lock', held by resize_as_completed\.py's main thread\)", waits), waits
    assert "who must act is not recorded" not in waits, waits
    assert re.search(rf"  STUCK FOR GOOD: a cycle: resize_as_completed\.py's main thread waits "
                     rf"in as_completed\(\) over 3 futures: .* run by {worker}.*; {worker} "
                     rf"waits for lock 'log_lock', which resize_as_completed\.py's main thread "
                     rf"holds", waits), waits


@pytest.mark.timeout(150)
def test_wait_first_completed_names_its_tasks_and_the_threads_that_run_them(runs):
    err = hung(result(runs, "fastest_mirror.py"))
    waits = _waits(err)
    assert ("  fastest_mirror.py's main thread waits: futures.wait() over 3 futures (the first "
            "to finish): fetch('eu.example.org'), fetch('us.example.org') and "
            "fetch('asia.example.org') -- fastest_mirror.py's ThreadPoolExecutor-0_0 and "
            "fastest_mirror.py's ThreadPoolExecutor-0_1 and fastest_mirror.py's "
            "ThreadPoolExecutor-0_2 run them, and one must finish") in waits, waits
    assert "a lock held while waiting for a task that takes it" in err, err


@pytest.mark.timeout(150)
@pytest.mark.skipif(not FORK, reason="under forkserver (3.14's default) the executor starts "
                    "one worker here: no second worker to lose the race")
def test_an_idle_worker_whose_get_lost_the_race_for_the_one_task_is_still_idle(runs):
    """Both workers saw the one task in the call queue; the loser's get found it there (so no
    wait was recorded), then blocked when the winner took it. A fresh-clone run saw this: the
    verdict then left the idle worker out. Its stack (the watchdog's) says where it is: in the
    stdlib's get, inside the executor's loop. The run's own events, the idle get cut out."""
    from mpviz.trace import watchdog
    err = hung(result(runs, "executor_task_waits_lock.py"))
    trace = mt.load(re.search(r"recording into (\S+) ", err).group(1))
    runner = re.search(r"(ForkProcess-\d)'s main thread runs it", err).group(1)
    idle = next(p for p in trace.processes() if p.name.startswith("ForkProcess") and
                p.name != runner)
    cut = mt.Trace(events=[e for e in trace.events
                           if not (e.pid == idle.pid and e.kind == "wait.begin")])
    assert f"  {idle.name} is idle, not stuck: it waits for its next task from the " \
           f"ProcessPoolExecutor" in "\n".join(watchdog.waits_in_words(cut))


@pytest.mark.timeout(150)
def test_the_stacks_kept_in_the_trace_show_no_frame_of_mpvizs_hooks(runs):
    """The verdict's stacks left mpviz's recording hooks out; the stacks kept in the trace
    (``watchdog.stuck``, trace.json) showed them: `_queue_get (messages.py)`, `get (waits.py)`
    between the stdlib's get and the executor's loop (issue 27: mpviz's own frames never
    appear in a user's stacks)."""
    err = hung(result(runs, "executor_task_waits_lock.py"))
    folder = re.search(r"recording into (\S+) ", err).group(1)
    hooks = os.sep + os.path.join("mpviz", "trace") + os.sep
    stacks = [e.args["stacks"] for e in mt.load(folder).of_kind("watchdog.stuck")]
    assert stacks and any("queues.py" in s for s in stacks), stacks
    assert not any(hooks in s for s in stacks), stacks
    with open(os.path.join(folder, "trace.json")) as f:
        assert hooks not in f.read().replace("\\/", "/")


@pytest.mark.timeout(150)
def test_a_task_waiting_for_a_task_queued_behind_it_is_named_and_is_one_cycle(runs):
    # Said before: "ThreadPoolExecutor-0_0 waits: a future's result -- who must act is not
    # recorded", and no cycle: a future no thread runs yet was nameless.
    waits = _waits(hung(result(runs, "one_worker_pipeline.py")))
    me = "one_worker_pipeline.py's ThreadPoolExecutor-0_0"
    assert (f"  {me} waits: the result of tokenize('a b c') -- {me} must finish its own task "
            f"first -- and that thread is this one, waiting here; tokenize('a b c') waits in "
            f"the executor's queue for a free thread (the ThreadPoolExecutor has 1)") in waits, \
        waits
    # (the cycle is the executor's thread alone; the main thread waits behind it)
    assert (f"  STUCK FOR GOOD: a cycle: {me} waits for the result of tokenize('a b c'), "
            f"which waits in the executor's queue for a free thread -- and the executor's "
            f"only thread is {me} itself: it waits for itself, and can never go on -- and "
            f"behind it, one_worker_pipeline.py's main thread waits for the result of "
            f"parse('a b c'), which {me} runs") in waits, waits
    assert "who must act is not recorded" not in waits, waits


@pytest.mark.timeout(150)
@pytest.mark.skipif(not FORK, reason="under forkserver (3.14's default) the executor starts "
                    "one worker here: none is idle")
def test_the_wait_for_graph_leaves_an_idle_worker_out_and_says_it_is_idle(runs):
    """An executor's idle worker, waiting for its next task, was drawn in the wait-for graph
    as a thread blocked on an empty queue that the main thread's feeder must fill -- beside
    the cycle, as if part of the hang. It is left out, and the title says it is idle."""
    import importlib
    wait_for = importlib.import_module("mpviz.viz.wait_for")   # (viz.wait_for: the function)
    err = hung(result(runs, "executor_task_waits_lock.py"))
    trace = mt.load(re.search(r"recording into (\S+) ", err).group(1))
    runner = re.search(r"(ForkProcess-\d)'s main thread runs it", err).group(1)
    idle = next(p for p in trace.processes() if p.name.startswith("ForkProcess") and
                p.name != runner)
    state = st.state_at(trace, st.stuck_moment(trace))
    assert state.idle == {idle.pid}, state.idle
    nodes, _, _, _ = wait_for._graph(state)
    assert ("thread", (idle.pid, idle.pid)) not in nodes, nodes
    fig = wait_for.wait_for(trace)
    title = fig.axes[0].get_title(loc="left")
    assert f"idle, not stuck (waiting for their next task, not drawn): {idle.name}" in title, \
        title


@pytest.mark.timeout(150)
def test_the_words_of_two_arrows_both_ways_between_two_boxes_do_not_overlap(runs, fonts_loaded):
    """The one-thread pipeline: ThreadPoolExecutor-0_0 -> the result of tokenize(...) ->
    ThreadPoolExecutor-0_0, two arcs between the same two boxes. Their words were written at
    the one middle of their chord, over each other ("must finish its own task first" across
    "blocks"); each now stands beside its own arc."""
    import importlib
    wait_for = importlib.import_module("mpviz.viz.wait_for")
    err = hung(result(runs, "one_worker_pipeline.py"))
    fig = wait_for.wait_for(mt.load(re.search(r"recording into (\S+) ", err).group(1)))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    words = [t for t in fig.axes[0].texts if t.get_text() in
             ("must finish its own task first", "blocks")]
    assert len(words) >= 2, [t.get_text() for t in fig.axes[0].texts]
    boxes = [t.get_window_extent(renderer) for t in words]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)


@pytest.mark.timeout(150)
def test_no_word_of_the_circle_stands_on_a_box(runs, fonts_loaded):
    """The one-thread pipeline's circle: the long arc from ThreadPoolExecutor-0_0 back to "the
    result of parse(...)" passes over the main thread's box, and its words ("runs it and must
    finish it") were written at its chord's middle -- on that box. Each word now stands by the
    middle of its own arc, on the side the arc bends to, and on no box."""
    import importlib
    wait_for = importlib.import_module("mpviz.viz.wait_for")
    err = hung(result(runs, "one_worker_pipeline.py"))
    fig = wait_for.wait_for(mt.load(re.search(r"recording into (\S+) ", err).group(1)))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = fig.axes[0].texts
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in texts
             if t.get_bbox_patch() is not None]
    words = [t for t in texts if t.get_bbox_patch() is None]
    assert any(t.get_text() == "runs it and must finish it" for t in words), \
        [t.get_text() for t in texts]
    for word in words:
        extent = word.get_window_extent(renderer)
        assert not any(extent.overlaps(box) for box in boxes), word.get_text()


@pytest.mark.timeout(150)
def test_a_worker_on_a_manager_queue_joined_without_its_sentinel_is_one_cycle_with_the_fix(
        runs):
    # Said before: the two lines, true but apart -- a get() on a Manager's queue, through its
    # proxy, was left out of cycles
    err = hung(result(runs, "manager_queue_no_sentinel.py"))
    assert ("STUCK FOR GOOD: a cycle: manager_queue_no_sentinel.py's main thread waits in join() "
            "for Process-2 to exit; Process-2's main thread waits in get() on the Manager's "
            "Queue 1 (kept in SyncManager-1, pid ") in err, err
    assert (") for manager_queue_no_sentinel.py's main thread to put. Each waits for the next: "
            "none can go on. A process that loops on `q.get()` ends only when it gets what it "
            "stops at, and nothing more will be put. Fix: before join(), put one sentinel per "
            "worker (`q.put(None)`") in err, err
