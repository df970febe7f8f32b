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
         "thread_pool_gate_held.py")


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
        assert idle, state.blocked
    for b in state.blocked:
        assert not any(pid in servers for pid, _ in b.waits_for), (b, servers)
    assert not any(d.pid in servers for d in state.deadlocks), state.deadlocks
