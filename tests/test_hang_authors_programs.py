"""Hang verdicts on programs written as their authors write them (issue 27): every word true.

Each program in tests/hang_programs/ hangs (or nearly) in a classic way that the other hang
tests do not cover, and runs through ``python -m mpviz trace --hang-after S`` as a learner runs
it; all are started at once (they spend their time waiting), each judged alone:

    wait_go_signal.py 1       a worker checks an Event every second and gives up after a
                              minute: the others wait for ever, but its loop may still end it
                              -- mpviz cannot tell, so never "nobody can ever move"
    wait_go_signal.py 20      the same, checking every 20 s: a wait with a deadline to come,
                              STALLED, not a deadlock
    slots_never_released.py   Semaphore(0): its count is 0 and nobody releases it -- not "a lock
                              which nobody holds"
    loader_raises.py          the producer raised before its put; the parent's get() waits for
                              ever: the verdict names the producer, how it ended, and why
    spawn_nothing_to_send.py  torch's mp.spawn: rank 0 returns without putting, rank 1 waits
    callback_raises.py        a Pool callback raises (gh-83371): the Pool's result handler
                              thread dies, pool.join() waits for ever -- said, with the line
    pool_exception_not_rebuilt.py  a task's exception cannot be unpickled (gh-103061): the
                              result handler dies of it -- said, and why
    pool_initializer_fails.py every Pool worker dies in its initializer and is replaced, for
                              ever (gh-87472): processes come and go, nothing is done
    barrier_two_of_three.py   a Barrier for three, two parties started: one more must come
    loader_lock_left_held.py  a DataLoader's dataset leaves its Lock held on one path: a worker
                              waits for the lock it holds, while the main thread's get() has
                              a 5 s timeout still to run -- a deadlock, not "may move later"
    lock_held_over_join.py    the parent joins a child while holding the lock the child needs
    result_joined_first.py    a big result sent over a Pipe while the parent joins first
    notify_before_wait.py     the lost wake-up: a Condition notified before its waiter waits
    start_event_never_set.py  workers wait for a start Event nobody sets
    paused_for_ever.py        a worker paused by clear(), never resumed: the parent joins it
    crawler_waits_on_its_own_pool.py  ThreadPool tasks that wait for jobs of their own pool
    sort_then_wait.py         subprocess: p.wait() before reading the output of `sort`
    child_report_waited_first.py  the same with a Python child (recorded, unlike sort)
    worker_crashes_in_native_code.py  the producer dies of SIGSEGV before its put
    decode_with_forkserver.py the same under forkserver: the fork server reaps the worker
    result_with_open_file.py  workers put a dict holding an open file: the feeder cannot pickle
                              it, the child exits, nothing is printed, the get waits
    callback_runs_next_stage.py  a Pool callback calls pool.apply(): the result handler
                              thread waits for a result only it can deliver
    model_server_never_ready.py  the parent waits on a `ready` Event the server sets after
                              loading its model -- which raises first
    resize_task_done_skipped.py  a JoinableQueue worker raises on one item before its
                              task_done(): the parent's q.join() waits for ever
    embed_without_detach.py   (torch) workers put a model's output, a non-leaf tensor that
                              requires grad: torch refuses it in the feeder (pitfall 14)
    count_words_threads.py    threads and a queue.Queue: the producer thread raises before
                              its None; the consumer's get() and the main thread's join wait
    replace_worker_with_terminate.py  terminate() kills an idle worker inside its get(),
                              holding the queue's read lock: its replacement never gets a task
    fetch_without_sentinel.py threads loop on a queue.Queue's get() with no sentinel; the main
                              thread joins them after q.join(): a cycle of a join and a get
    queue_docs_worker_raises.py  the queue docs' daemon worker raises before one task_done():
                              the main thread's q.join() waits for ever
    ready_never_given.py      one process: a thread waits on a threading.Event the main thread
                              never sets, and the main thread joins it
    count_reaches_three.py    a consumer's Condition.wait_for(count >= 3); the producer adds 2:
                              its notifies came before the wait, and found the condition false
    start_signal_threading_event.py  a worker waits on a module-level threading.Event; the
                              parent's set() sets its own copy (fork and spawn)
    total_via_thread_queue.py  a forked worker puts its total on a queue.Queue it was given;
                              the parent's get() waits on its own
    file_checks_module_queue.py  workers put their verdicts on a module-level queue.Queue
                              (fork and spawn); the parent's get() waits on its own
    thumbnails_no_task_done.py  workers take images from a JoinableQueue and never call
                              task_done(); the main process waits in q.join()
    jobs_with_callbacks.py    jobs put on a JoinableQueue with a lambda to call: the feeder
                              cannot pickle them and drops them; q.join() waits for ever
    log_file_on_task_queue.py  a task put with the open log file: dropped by the feeder; the
                              worker waits in get(), the main process joins it
    resize_tasks_with_log.py  the same with a None to stop: it ends well, the tasks lost
    printer_thread_not_stopped.py  a thread loops on a queue.Queue's get(); the main thread
                              ends without stopping it: Python waits for it at exit
    flush_on_stop_event.py    the same, the thread waiting for a threading.Event nobody sets
    server_never_stopped.py   the same with a worker process and a multiprocessing Queue
    parse_files_apply_async.py  Pool tasks that raise, their results never asked for: it
                              ends with status 0 and "all files parsed"
    parse_files_executor.py   the same with a ProcessPoolExecutor's futures
    hogwild_forgot_share_memory.py  mnist_hogwild's shape without model.share_memory():
                              each forked worker trains its own copy
    transfer_two_locks.py     two clerks lock the account they take from, then the one they
                              pay into: opposite orders (multiprocessing.Lock)
    downloads_into_module_queue.py  the same, with workers that download for 2.5 s (spawn):
                              the parent can never move after 1 s; the verdict waits for them
    downloads_after_module_setup.py  the same, with a table of word ids built at import: each
                              spawn child builds it again (seconds) before it begins to run
    squares_after_with.py     map_async() inside `with Pool(...)`, its get() after the block:
                              __exit__ terminated the Pool, and the result never comes
    thumbnails_after_with.py  the same with a list of apply_async() results
    scores_pool_terminate.py  terminate() where close() was meant, then get()
    sum_via_manager_queue.py  a Pool task loops on a Manager Queue's get() until None; main
                              puts the numbers, no None, and waits for the task's result
    count_under_lock_join.py  the parent holds the Lock its workers take while it joins them
    fetch_pages_threadpool.py  map_async() inside `with ThreadPool(...)`, get() after it
    result_then_os_exit.py    a worker puts its result, then leaves by os._exit(0): the feeder
                              never writes it, and the parent's get() after join() waits
    hogwild_trainer_object.py  Hogwild with the model in a Trainer, target=trainer.train, no
                              share_memory(): each worker trains its own copy
    slots_threading_semaphore.py  a worker acquires a module-level threading.Semaphore(0); the
                              parent releases its own (fork and spawn)
    batch_ready_condition.py  a loader waits on a module-level threading.Condition; the
                              parent notifies its own (fork and spawn)
    phases_threading_barrier.py  two forked workers meet at a module-level threading.Barrier(2):
                              each waits at its own copy
    config_loaded_condition.py  the main thread waits on a threading.Condition that a loader
                              thread would notify -- the loader raised on a bad line
    slow_sensor_thread.py     a sensor thread sleeps 3 s between its puts: the main thread's
                              join and the logger's get() wait for it -- STALLED, no cycle
    account_lock_taken_twice.py  deposit() holds the account's threading.Lock and calls
                              report(), which takes it again: with and without --threading-locks
    consumers_fed_after_with.py  ThreadPoolExecutor tasks get() from a queue.Queue that the
                              main thread fills after the `with` block, which waits for them
    bounded_queue_writer_raises.py  a reader thread fills a queue.Queue(maxsize=2); the writer
                              thread raises on a bad line: the reader's put() waits for ever
    parser_fed_by_main_later.py  a collector thread puts a header and joins the parser; the
                              main thread sleeps 20 s, then puts the rest: no cycle
    stop_event_worker.py      a worker process loops on a multiprocessing Queue's get() until a
                              stop Event is set; the parent sets it and joins: a cycle
    stop_event_late_producer.py  the same, with a producer process still asleep before its last
                              put: no cycle (it may still put)
    squares_sentinel_forgotten.py  a worker loops `for n in iter(jobs.get, None)`; the parent
                              joins it without sending the None: the cycle, and no stop Event
    results_via_global.py     three threads put into a module-level queue.Queue; the first
                              ends holding the lock the other two wait for
    worker_never_started.py   forked workers use module-level multiprocessing Queues; the
                              parent waits for two workers' results and started one
    spawn_global_event.py     a spawned worker waits on a module-level Event; the parent sets
                              its own (the child made another when it imported the module)
    wrong_event_set.py        a spawned worker given its Event as an argument waits on it; the
                              parent sets another one
"""
import importlib.util
import os
import pickle
import re
import sys

import pytest

import mpviz.trace as mt
from test_hang_classes import hung, result, together, trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_programs")


def _program(name):
    return os.path.join(PROGRAMS, name)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{program: result} of every program here, run under its own launcher, all at once."""
    programs = {name: ("1.5", _program(name)) for name in (
        "slots_never_released.py", "loader_raises.py", "callback_raises.py",
        "pool_initializer_fails.py", "pool_exception_not_rebuilt.py",
        "barrier_two_of_three.py", "lock_held_over_join.py", "result_joined_first.py",
        "notify_before_wait.py", "start_event_never_set.py", "paused_for_ever.py",
        "crawler_waits_on_its_own_pool.py", "sort_then_wait.py",
        "child_report_waited_first.py", "worker_crashes_in_native_code.py",
        "decode_with_forkserver.py", "result_with_open_file.py",
        "callback_runs_next_stage.py", "model_server_never_ready.py",
        "resize_task_done_skipped.py", "count_words_threads.py",
        "replace_worker_with_terminate.py", "fetch_without_sentinel.py",
        "queue_docs_worker_raises.py", "slow_sensor_thread.py",
        "account_lock_taken_twice.py", "consumers_fed_after_with.py",
        "bounded_queue_writer_raises.py", "parser_fed_by_main_later.py",
        "stop_event_worker.py", "stop_event_late_producer.py",
        "squares_sentinel_forgotten.py", "results_via_global.py",
        "worker_never_started.py", "spawn_global_event.py", "wrong_event_set.py",
        "count_reaches_three.py", "ready_never_given.py", "total_via_thread_queue.py",
        "phases_threading_barrier.py", "config_loaded_condition.py",
        "thumbnails_no_task_done.py", "jobs_with_callbacks.py", "log_file_on_task_queue.py",
        "transfer_two_locks.py", "resize_tasks_with_log.py", "printer_thread_not_stopped.py",
        "server_never_stopped.py", "parse_files_apply_async.py", "parse_files_executor.py",
        "hogwild_forgot_share_memory.py", "flush_on_stop_event.py", "squares_after_with.py",
        "thumbnails_after_with.py", "scores_pool_terminate.py", "sum_via_manager_queue.py",
        "count_under_lock_join.py", "fetch_pages_threadpool.py", "result_then_os_exit.py")}
    programs["hogwild_forgot_share_memory.py share"] = (
        "10", _program("hogwild_forgot_share_memory.py"), "share")
    programs["hogwild_trainer_object.py"] = ("10", _program("hogwild_trainer_object.py"))
    programs["hogwild_trainer_object.py share"] = (
        "10", _program("hogwild_trainer_object.py"), "share")
    for method in ("fork", "spawn"):
        programs[f"start_signal_threading_event.py {method}"] = (
            "1.5", _program("start_signal_threading_event.py"), method)
        programs[f"file_checks_module_queue.py {method}"] = (
            "1.5", _program("file_checks_module_queue.py"), method)
        programs[f"slots_threading_semaphore.py {method}"] = (
            "1.5", _program("slots_threading_semaphore.py"), method)
        programs[f"batch_ready_condition.py {method}"] = (
            "1.5", _program("batch_ready_condition.py"), method)
    # (workers that download for 2.5 s: the parent's get() can never move after 1 s, but the
    # story is what the children do next)
    programs["downloads_into_module_queue.py"] = ("1", _program("downloads_into_module_queue.py"),
                                                  "spawn")
    # (the same, with children that take seconds to start: the module they import builds a
    # table; the grace is counted from when they began to run -- a CI run judged them killed
    # while still importing, with the false words)
    programs["downloads_after_module_setup.py"] = (
        "1", _program("downloads_after_module_setup.py"), "spawn")
    programs["account_lock_taken_twice.py locks"] = ("1.5 --threading-locks",
                                                     _program("account_lock_taken_twice.py"))
    programs["wait_go_signal.py 1"] = ("2", _program("wait_go_signal.py"), "1")
    # (STALLED only while its first deadline is still to come: every 5 s was too short once,
    # when the launchers of ~70 programs at once on 2 cores judged it after that deadline had
    # run out and begun again -- a loop that polls, rightly "DEADLOCK, unless a loop gives up")
    programs["wait_go_signal.py 20"] = ("1.5", _program("wait_go_signal.py"), "20")
    if importlib.util.find_spec("torch") is not None:
        programs["spawn_nothing_to_send.py"] = ("2", _program("spawn_nothing_to_send.py"))
        programs["loader_lock_left_held.py"] = ("2", _program("loader_lock_left_held.py"))
        programs["embed_without_detach.py"] = ("2", _program("embed_without_detach.py"))
    return together(tmp_path_factory, programs)


# --- statements that were false, or the fact that was missing ---------------------------------

@pytest.mark.timeout(150)
def test_a_loop_that_polls_is_never_said_to_be_unable_to_move(runs):
    # It wakes every second (it prints "still waiting") and would give up by itself after a
    # minute. Said before: "no thread of any process moved and no event was recorded ...
    # nobody can ever move" -- it moved each second, and its timeouts were recorded.
    err = hung(result(runs, "wait_go_signal.py 1"))
    assert "HANG: DEADLOCK, unless a loop gives up by itself" in err, err
    assert "nobody can ever move" not in err and "no event was recorded" not in err, err
    assert "nothing was recorded but waits that timed out and began again" in err, err
    assert re.search(r"Only the polling loop of Process-1 \(pid \d+\)'s main thread can still "
                     r"end this, if its code stops waiting by itself \(a deadline, a number of "
                     r"tries\); mpviz cannot tell whether it does", err), err
    assert "(wait_go_signal.py:13): `while not go.wait(timeout=EVERY):`" in err, err


@pytest.mark.timeout(150)
def test_a_semaphore_made_with_no_count_is_said_to_need_a_release_not_a_free_lock(runs):
    # Said before: "waits for lock 'slots', which nobody holds" (a free lock is no wait).
    err = hung(result(runs, "slots_never_released.py"))
    assert "which nobody holds" not in err and "lock 'slots'" not in err, err
    for worker in ("Process-1", "Process-2"):
        assert (f"{worker}'s main thread waits for Semaphore 'slots': its count is 0, and no "
                f"thread the trace recorded holds an acquire of it to release -- it goes on "
                f"only when some thread calls its release()") in err, err
    assert "at worker (slots_never_released.py:6): `slots.acquire()`" in err, err


@pytest.mark.timeout(150)
def test_a_get_whose_producer_raised_names_the_producer_and_its_error(runs):
    # Said before: only "someone must put into Queue 1, and nobody has put into it yet" --
    # not a word about the one process that could have put, which had ended with an error.
    err = hung(result(runs, "loader_raises.py"))
    assert "FileNotFoundError: [Errno 2] No such file or directory" in err   # its traceback
    mpviz_files = os.path.join(ROOT, "mpviz", "")          # (the checkout may be named mpviz)
    assert mpviz_files not in err.split("Traceback (most recent call last):")[1].split(
        "FileNotFoundError")[0], err                                         # ours hidden
    assert ("loader_raises.py's main thread waits: get() on Queue 1: nothing in it yet -- "
            "someone must put into Queue 1, and nobody has put into it yet; Process-1 was "
            "given Queue 1 (a Process argument) and ended (exit 1, after FileNotFoundError: "
            "[Errno 2] No such file or directory: '/nonexistent/data.txt', raised at load "
            "(loader_raises.py:7): `with open(path) as f:`) without putting into it: that put "
            "will never come") in err, err
    assert "ENDED BY AN ERROR" not in err, err          # (said once, in the wait's line)


@pytest.mark.timeout(150)
def test_a_spawned_rank_that_returned_without_putting_is_named_to_the_rank_that_waits(runs):
    pytest.importorskip("torch")
    err = hung(result(runs, "spawn_nothing_to_send.py"))
    assert re.search(r"SpawnProcess-2 \(pid \d+\), main thread: reads a pipe \(fd \d+\), with no "
                     r"time limit .* at run \(spawn_nothing_to_send.py:12\): `data = q.get\(\)`",
                     err), err
    assert ("SpawnProcess-2's main thread waits: get() on Queue 1: nothing in it yet -- someone "
            "must put into Queue 1, and nobody has put into it yet; SpawnProcess-1 was given "
            "Queue 1 (a Process argument) and ended (exit 0) without putting into it: that put "
            "will never come") in err, err


@pytest.mark.timeout(150)
def test_a_pool_callback_that_raised_is_said_to_have_ended_the_pools_result_handler(runs):
    # Said before: only "worker 0 is idle, not stuck", "worker 1 is idle, not stuck": nothing
    # of the dead thread that pool.join() waits on -- or, as often, no verdict at all: the
    # Pool's worker handler thread spins on the result nobody reads, and CPU was progress.
    err = hung(result(runs, "callback_raises.py"))
    # (Python 3.14 says "division by zero", earlier ones "integer division or modulo by zero")
    said = "division by zero" if sys.version_info >= (3, 14) else "integer division or modulo by zero"
    assert f"ZeroDivisionError: {said}" in err                               # its traceback
    assert re.search(r"ENDED BY AN ERROR: callback_raises.py's thread `Thread-\d+ "
                     r"\(_handle_results\)` ended with ZeroDivisionError: " + said + r", raised at record \(callback_raises.py:15\): "
                     r"`scores\[name\] = 100 // n`: that thread is the Pool's result handler -- "
                     r"no result of this Pool is delivered any more, so whatever waits for one, "
                     r"and pool.join\(\), waits for ever \(it runs each callback= and "
                     r"error_callback=, and yours raised", err), err
    # When the dead handler left a result unread, the Pool's worker handler thread spins on it
    # (CPU used, nothing done): not progress -- the headline says why (else nobody moves)
    if "nobody can ever move" not in err:
        assert re.search(r"HANG: DEADLOCK -- callback_raises.py \(pid \d+\)'s Pool can deliver "
                         r"no result any more: its result handler thread \(`Thread-\d+ "
                         r"\(_handle_results\)`\) ended with ZeroDivisionError", err), err


@pytest.mark.timeout(150)
def test_a_task_exception_the_pool_cannot_unpickle_is_said_to_have_ended_its_result_handler(
        runs):
    # Before: only "the result of Pool job 0 -- who must act is not recorded"
    err = hung(result(runs, "pool_exception_not_rebuilt.py"))
    assert re.search(r"ENDED BY AN ERROR: pool_exception_not_rebuilt.py's thread `Thread-\d+ "
                     r"\(_handle_results\)` ended with AttributeError: 'int' object has no "
                     r"attribute 'two', raised at __init__ \(pool_exception_not_rebuilt.py:8\): "
                     r"`super\(\).__init__\(stuff.two\)`: that thread is the Pool's result "
                     r"handler .* \(it raised as it unpickled a result: an exception whose class "
                     r"cannot be rebuilt from its args, CPython gh-103061", err), err
    assert "callback" not in err, err


@pytest.mark.timeout(150)
def test_pool_workers_that_die_in_their_initializer_for_ever_are_a_hang_not_progress(runs):
    # Before: no verdict at all -- workers started and ended, so something always moved.
    err = hung(result(runs, "pool_initializer_fails.py"))
    assert re.search(r"HANG: DEADLOCK -- pool_initializer_fails.py \(pid \d+\)'s main thread "
                     r"waits for a Pool's results that can never come: in the last 1.5 s \d+ of "
                     r"the Pool's workers ended, each before it ran a task \(the last: exit 1, "
                     r"after OperationalError: unable to open database file, raised at open_db "
                     r"\(pool_initializer_fails.py:13\): `conn = sqlite3.connect\(DB\)`\)", err), err
    assert "BrokenProcessPool when an initializer fails" in err, err
    # (how many workers came and went before the hang depends on the load: 3 on a loaded CI
    # machine, listed; more, counted)
    assert re.search(r"ENDED BY AN ERROR: ((worker \d+, )?worker \d+ and worker \d+|\d+ processes "
                     r"\(worker \d+, worker \d+, worker \d+ \.\.\. worker \d+\)) ended \(exit 1, "
                     r"after OperationalError", err), err


@pytest.mark.timeout(150)
def test_a_barrier_short_of_parties_says_how_many_more_must_come(runs):
    # Said before: "Barrier 1.wait() -- who must act is not recorded"
    err = hung(result(runs, "barrier_two_of_three.py"))
    for worker in ("Process-1", "Process-2"):
        assert (f"{worker}'s main thread waits: Barrier 1.wait() -- it lets its waiters go when "
                f"3 wait at it, and 2 wait now: 1 more must call its wait()") in err, err


@pytest.mark.timeout(150)
def test_a_worker_waiting_for_the_lock_it_holds_is_a_deadlock_whatever_deadline_runs_elsewhere(
        runs):
    # Said before: "HANG: STALLED ... not a deadlock: they may move later" (the DataLoader's
    # main thread polls with a 5 s timeout) above "STUCK FOR GOOD: a cycle".
    pytest.importorskip("torch")
    err = hung(result(runs, "loader_lock_left_held.py"))
    assert "STALLED" not in err and "may move later" not in err, err
    assert re.search(r"HANG: DEADLOCK -- DataLoader worker (\d) \(pid \d+\)'s main thread and "
                     r"DataLoader worker (?!\1)\d \(pid \d+\)'s main thread can never move: ", err), err
    assert re.search(r"DataLoader worker (\d)'s main thread waits for Lock 1, which it holds "
                     r"itself: a Lock is not re-entrant", err), err
    assert re.search(r"DataLoader worker \d's main thread waits for Lock 1, which DataLoader "
                     r"worker \d's main thread holds", err), err
    assert "some threads wait with a deadline that has not run out within --hang-after 2 s " \
        "(they may still move -- that frees none of the above)" in err, err
    assert "at __getitem__ (loader_lock_left_held.py:17): `self.lock.acquire()`" in err, err


# --- verdicts that were already true, kept so ---------------------------------------------------

@pytest.mark.timeout(150)
def test_a_wait_with_a_deadline_still_to_come_is_stalled_not_a_deadlock(runs):
    err = hung(result(runs, "wait_go_signal.py 20"))
    assert "HANG: STALLED" in err and "DEADLOCK" not in err, err
    assert re.search(r"Process-1 \(pid \d+\), main thread: waits for a lock or condition, with a "
                     r"timeout .* at worker \(wait_go_signal.py:13\): "
                     r"`while not go.wait\(timeout=EVERY\):`",
                     err), err


@pytest.mark.timeout(150)
def test_a_parent_joining_while_holding_the_childs_lock_is_a_cycle_in_words(runs):
    err = hung(result(runs, "lock_held_over_join.py"))
    assert "HANG: DEADLOCK -- for" in err and "nobody can ever move" in err, err
    assert ("Process-1's main thread waits for lock 'lock', held by lock_held_over_join.py's "
            "main thread") in err, err
    assert re.search(r"lock_held_over_join.py's main thread waits: join Process-1 \(pid \d+\) -- "
                     r"Process-1's main thread must exit", err), err
    assert "at work (lock_held_over_join.py:6): `with lock:`" in err, err


@pytest.mark.timeout(150)
def test_a_pipe_send_of_a_big_result_while_the_parent_joins_is_a_full_socket_and_a_join(runs):
    err = hung(result(runs, "result_joined_first.py"))
    assert re.search(r"Process-1 \(pid \d+\), main thread: writes into a socket \(fd \d+\), which "
                     r"is full, with no time limit .* at compute \(result_joined_first.py:7\): "
                     r"`conn.send\(result\)`", err), err
    # (join waits on the child's pid under fork, on its sentinel pipe under forkserver: 3.14)
    assert re.search(r"result_joined_first.py \(pid \d+\), main thread: (waits for a child process "
                     r"to end \(join, wait\)|waits for a pipe, socket or file to be ready \(poll), "
                     r"with no time limit.* at <module> "
                     r"\(result_joined_first.py:15\): `p.join\(\)`", err), err


def test_a_stack_faulthandler_read_while_its_thread_spun_is_cut_not_given_to_the_main_thread():
    """faulthandler reads frames without the GIL: the stack of a thread that spins (a Pool's
    worker handler, after its result handler died) can come out as garbage -- a line past its
    file's end, then "__loader__", line 257562111 in ???. The verdict said the main thread
    waited "at ??? (__loader__:257562111)" (a block with no threading._bootstrap at its end was
    taken for the main thread's). Seen in callback_raises.py's run; its text, shortened:"""
    import selectors
    import threading

    import mpviz.trace as mt
    from mpviz.trace import stuck
    from mpviz.trace.watchdog import stack_summary
    text = ('Thread 0x00007fa836bfe6c0 (most recent call first):\n'
            f'  File "{threading.__file__}", line 982 in run\n'
            f'  File "{threading.__file__}", line 1002 in _bootstrap\n'
            '\n'
            'Thread 0x00007fa8373ff6c0 (most recent call first):\n'
            f'  File "{selectors.__file__}", line 941 in register\n'
            '  File "__loader__", line 257562111 in ???\n'
            '  File ')
    with mt.record() as trace:
        pass
    assert 1 not in stuck._stacks_by_thread(trace, 1, text)    # (pid 1: the main thread's)
    said = stack_summary({1: {"name": "prog.py", "stacks": text}})
    assert "__loader__" not in said and "???" not in said and "main thread" not in said, said
    assert "a thread: (not readable from here on: the thread ran on while its stack was " \
        "taken)" in said, said


def test_a_forked_childs_frames_below_the_fork_are_not_taken_for_garbage():
    """Below the fork (popen_fork.py's _launch) a forked child's stack goes on into its
    parent's frames, which Python 3.14's faulthandler writes as '"__init__", line ??? in
    __init__' and '<invalid frame>': the parent's, cut anyway -- not a stack read while its
    thread ran on. Taken for garbage, the child's main thread was dropped and 3.14's verdict of
    the logging-thread fork (test_hang_classes) lost the worker's own line."""
    import inspect
    import multiprocessing.pool
    import multiprocessing.popen_fork
    import threading

    import mpviz.trace as mt
    from mpviz.trace import stuck
    program = os.path.join(ROOT, "notebooks", "programs", "hang_logging_pool.py")
    fork = multiprocessing.popen_fork.__file__
    launch = inspect.getsourcelines(multiprocessing.popen_fork.Popen._launch)[1] + 1
    text = ('Current thread 0x00007fdaee856200 [python] (most recent call first):\n'
            f'  File "{threading.__file__}", line 314 in __enter__\n'
            f'  File "{program}", line 29 in square\n'
            f'  File "{multiprocessing.pool.__file__}", line 125 in worker\n'
            f'  File "{fork}", line {launch} in _launch\n'
            f'  File "{fork}", line 20 in __init__\n'
            '  File "__init__", line ??? in __init__\n'
            '  <invalid frame>\n')
    with mt.record() as trace:
        pass
    main = stuck._stacks_by_thread(trace, 1, text).get(1)      # (pid 1: the main thread's)
    assert main and ("square", program, 29) in main, main


@pytest.mark.timeout(150)
def test_a_notify_that_came_before_the_wait_is_said_to_have_woken_nobody(runs):
    # Said before: "Condition 1.wait() -- who must act is not recorded".
    err = hung(result(runs, "notify_before_wait.py"))
    assert "nobody can ever move" in err, err
    assert re.search(r"Process-1's main thread waits: Condition 1.wait\(\) -- someone must "
                     r"notify Condition 1 again; its last notify_all\(\), by "
                     r"notify_before_wait.py's main thread, came \d+\.\d s before this wait "
                     r"began and woke nobody: a notify wakes only the threads already waiting. "
                     r"Fix: change what the waiter checks", err), err
    assert "at consumer (notify_before_wait.py:12): `cond.wait()`" in err, err


@pytest.mark.timeout(150)
def test_workers_waiting_for_an_event_nobody_set_are_told_so(runs):
    err = hung(result(runs, "start_event_never_set.py"))
    for worker in ("Process-1", "Process-2"):
        assert (f"{worker}'s main thread waits: Event 1.wait() -- someone must set Event 1, "
                f"and nobody has set it yet") in err, err
    assert "who must act is not recorded" not in err, err


@pytest.mark.timeout(150)
def test_a_worker_paused_by_clear_is_said_to_need_a_set_again_and_who_cleared_it(runs):
    err = hung(result(runs, "paused_for_ever.py"))
    assert ("Process-1's main thread waits: Event 1.wait() -- someone must set Event 1 again: "
            "paused_for_ever.py's main thread cleared it after its last set()") in err, err


@pytest.mark.timeout(150)
def test_thread_pool_tasks_waiting_for_their_own_pools_jobs_are_said_to_hold_every_worker(runs):
    # Said before: "the result of Pool job 0 -- who must act is not recorded" (a ThreadPool's
    # tasks were not recorded at all: its queues are set up by a method of its own).
    err = hung(result(runs, "crawler_waits_on_its_own_pool.py"))
    me = "crawler_waits_on_its_own_pool.py"
    assert re.search(rf"{re.escape(me)}'s main thread waits: the result of Pool job 0 -- "
                     rf"{re.escape(me)}'s Thread-[12] \(worker\) or {re.escape(me)}'s "
                     rf"Thread-[12] \(worker\) must finish its task", err), err
    lines = [line for line in err.splitlines() if "(worker) waits: the result of Pool job" in line]
    assert len(lines) == 2, err
    for line in lines:
        assert re.search(r"no worker has started job [12], submitted \d+\.\d s before: the "
                         r"Pool's workers the trace saw are all busy \(\S+'s Thread-[12] \(worker\) "
                         r"runs job 0 and \S+'s Thread-[12] \(worker\) runs job 0\), and this "
                         r"waiter is one of them: a task that waits for a result of its own "
                         r"Pool holds a worker while it waits", line), line
    assert "who must act is not recorded" not in err, err


@pytest.mark.timeout(150)
@pytest.mark.parametrize("program, child", [("sort_then_wait.py", "sort"),
                                            ("child_report_waited_first.py", "python -c")])
def test_a_subprocess_waited_for_before_its_output_is_read_is_a_cycle_with_the_fix(runs,
                                                                                  program,
                                                                                  child):
    # Said before: the two /proc lines, then "the trace recorded no wait that was still open",
    # and "? (pid N)" for a child that is not Python
    err = hung(result(runs, program))
    assert "nobody can ever move" in err and "? (pid" not in err, err
    assert re.search(rf"STUCK FOR GOOD: {re.escape(program)} \(pid \d+\)'s main thread waits "
                     rf"for {re.escape(child)} \(pid \d+\) to end, and its main thread writes "
                     rf"into a full pipe that only {re.escape(program)} \(pid \d+\) can read -- "
                     rf"after that wait, which never ends. Fix: read what the child writes "
                     rf"while it runs, then wait: with subprocess, p.communicate\(\)", err), err
    assert re.search(rf"{re.escape(program)}'s main thread waits: Popen.wait\(\) for "
                     rf"{re.escape(child)} \(pid \d+\) -- ", err), err


@pytest.mark.timeout(150)
def test_a_producer_that_crashed_in_native_code_is_named_with_its_signal(runs):
    # Said before: "nobody has put into it yet" and, at the end, "pid N (Process-1): how it
    # ended was not recorded" -- its parent never joined it; a zombie keeps its exit status
    # (3.14's default is forkserver: as decode_with_forkserver.py, below)
    err = hung(result(runs, "worker_crashes_in_native_code.py"))
    assert ("worker_crashes_in_native_code.py's main thread waits: get() on Queue 1: nothing in "
            "it yet -- someone must put into Queue 1, and nobody has put into it yet; Process-1 "
            "was given Queue 1 (a Process argument) and ended (crashed (SIGSEGV: a bad memory "
            "access, in native code) at worker_crashes_in_native_code.py:11 in worker(): "
            "`header = ctypes.string_at(BAD_POINTER, 16)`) without putting into it: that put "
            "will never come") in err, err
    assert "how it ended was not recorded" not in err, err


@pytest.mark.timeout(150)
def test_a_producer_that_crashed_under_forkserver_is_named_with_its_signal_and_line(runs):
    # Said before: "nobody has put into it yet", and "pid N (Process-1): how it ended was not
    # recorded": the fork server reaps its children at once, so no zombie is left to read.
    # faulthandler's report, written into the trace's stacks folder as the worker died, says it.
    err = hung(result(runs, "decode_with_forkserver.py"))
    assert ("decode_with_forkserver.py's main thread waits: get() on Queue 1: nothing in it yet "
            "-- someone must put into Queue 1, and nobody has put into it yet; Process-1 was "
            "given Queue 1 (a Process argument) and ended (crashed (SIGSEGV: a bad memory "
            "access, in native code) at decode_with_forkserver.py:12 in decode(): `header = "
            "ctypes.string_at(BAD_POINTER, 16)`) without putting into it: that put will never "
            "come") in err, err
    assert "how it ended was not recorded" not in err, err
    assert "Fatal Python error" not in err, err     # (the report went to mpviz, not stderr)


DECODE_AND_JOIN = """
import ctypes
import multiprocessing as mp
import sys


def decode(path):
    header = ctypes.string_at(0xFFFF_FFFF_FFFF_0000, 16)   # a C library's bug
    print(path, len(header))


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1])
    p = mp.Process(target=decode, args=("frame_0001.raw",))
    p.start()
    p.join()                   # (p.exitcode is never looked at: the program ends with 0)
    print("all frames decoded")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_child_that_crashed_is_named_with_its_line_though_nothing_hung(tmp_path, method):
    # Said before: nothing -- the program ended with status 0, and only p.exitcode (-11, never
    # read) knew. faulthandler's report, written into the trace's stacks folder as the child
    # died, gives the line.
    run = trace(tmp_path, DECODE_AND_JOIN, method)
    assert run.returncode == 0, run.stderr
    assert re.search(r"mpviz trace: pid \d+ \(Process-1\) crashed \(SIGSEGV: a bad memory "
                     r"access, in native code\) at prog\.py:8 in decode\(\): `header = "
                     r"ctypes\.string_at\(0xFFFF_FFFF_FFFF_0000, 16\)`", run.stderr), run.stderr
    assert "Fatal Python error" not in run.stderr, run.stderr


@pytest.mark.timeout(150)
def test_a_put_whose_object_cannot_be_pickled_is_named_with_the_feeders_error(runs):
    # Said before: "Process-1's main thread or Process-2's main thread must put -- but they
    # have ended": false -- both put; their messages died in their feeder threads, which
    # printed nothing (the processes were exiting).
    err = hung(result(runs, "result_with_open_file.py"))
    with open(__file__) as f:           # this Python's own words for it (3.13 changed them:
        try:                            # "cannot pickle 'TextIOWrapper' instances")
            pickle.dumps(f)
        except TypeError as e:
            words = f"TypeError: {e}"
    assert ("result_with_open_file.py's main thread waits: get() on Queue 1: nothing in it yet "
            "-- Process-1 and Process-2 put into Queue 1 and ended, but their messages never "
            "reached the queue's pipe: their feeder threads could not pickle what was put "
            f"({words}).") in err, err
    assert "Fix: put only what can be pickled" in err, err
    assert "but they have ended" not in err, err


@pytest.mark.timeout(150)
def test_a_pool_callback_that_waits_for_the_pool_is_a_deadlock_not_missed(runs):
    # Said before: nothing -- the watchdog never fired (the Pool's worker handler thread spins
    # while results wait unread, and its CPU counted as progress); the run went on until
    # `timeout` ended it.
    err = hung(result(runs, "callback_runs_next_stage.py"))
    assert re.search(r"HANG: DEADLOCK -- callback_runs_next_stage\.py \(pid \d+\)'s Pool can "
                     r"deliver no result any more: its result handler thread \(`Thread-\d+ "
                     r"\(_handle_results\)`\), which runs every callback=, is inside one that "
                     r"waits \(the result of Pool job \d+\)", err), err
    assert "Fix: a callback runs in the Pool's own thread" in err, err
    assert re.search(r"Thread-\d+ \(_handle_results\) waits: the result of Pool job \d+ -- its "
                     r"worker has finished it: the Pool's result handler thread must deliver "
                     r"its result -- and that is this very thread", err), err


@pytest.mark.timeout(150)
def test_an_event_whose_only_setter_raised_first_names_it_in_the_wait(runs):
    # Said before: "someone must set Event 1, and nobody has set it yet", and apart from it
    # "ENDED BY AN ERROR: Process-1 ended ..." -- the learner had to join the two.
    err = hung(result(runs, "model_server_never_ready.py"))
    assert ("model_server_never_ready.py's main thread waits: Event 1.wait() -- someone must "
            "set Event 1, and nobody has set it yet; Process-1 was given Event 1 (a Process "
            "argument) and ended (exit 1, after FileNotFoundError: [Errno 2] No such file or "
            "directory: 'model.bin', raised at serve (model_server_never_ready.py:7): `with "
            "open(\"model.bin\", \"rb\") as f:`) without setting it: that set will never "
            "come") in err, err
    assert "ENDED BY AN ERROR: Process-1" not in err, err      # (said once, where it matters)


@pytest.mark.timeout(150)
def test_a_non_leaf_tensor_put_on_a_queue_is_named_with_torchs_refusal(runs):
    # torch.multiprocessing's pitfall 14: "a non-leaf tensor silently missing from a Queue".
    # Said before: "Process-1's main thread or Process-2's main thread must put -- but they
    # have ended" (false: both put; torch refused to pickle in their feeder threads).
    if "embed_without_detach.py" not in runs:
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    err = hung(result(runs, "embed_without_detach.py"))
    assert ("embed_without_detach.py's main thread waits: get() on Queue 1: nothing in it yet "
            "-- Process-1 and Process-2 put into Queue 1 and ended, but their messages never "
            "reached the queue's pipe: their feeder threads could not pickle what was put "
            "(RuntimeError: Cowardly refusing to serialize non-leaf tensor which requires_grad")\
        in err, err
    assert "a tensor that requires grad: .detach() it" in err, err


@pytest.mark.timeout(150)
def test_a_consumer_that_raised_before_task_done_is_named_in_the_join(runs):
    # Said before: "Process-1's main thread or Process-2's main thread must call task_done()",
    # and Process-1's end nowhere (not even ENDED BY AN ERROR: the other worker's get() line
    # was taken to have said it, and had not).
    err = hung(result(runs, "resize_task_done_skipped.py"))
    assert re.search(r"resize_task_done_skipped\.py's main thread waits: q\.join\(\) on Queue 1: "
                     r"until every item is task_done\(\) -- .* must call task_done\(\); but "
                     r"Process-\d got from Queue 1 and ended \(exit 1, after ValueError: corrupt "
                     r"image: img3\.png, raised at worker \(resize_task_done_skipped\.py:10\): "
                     r"`raise ValueError\(f\"corrupt image: \{name\}\"\)`\): what it took last "
                     r"and did not mark task_done\(\) never will be", err), err
    assert "Fix: call task_done() in a `finally:`" in err, err


@pytest.mark.timeout(150)
def test_a_consumer_thread_whose_producer_thread_raised_is_not_said_to_wait_for_each_other(runs):
    # Said before: "count_words_threads.py: its threads wait for each other (a lock taken
    # twice, a join of a thread that waits for the joiner, ...)" -- false: nobody waits for
    # the joiner; the producer thread had ended with an error. Nor was the join a recorded
    # wait, nor was the consumer's /proc line given its line (its thread.start had no ident).
    err = hung(result(runs, "count_words_threads.py"))
    assert "its threads wait for each other" not in err, err
    assert ("count_words_threads.py: every thread left waits, with no time limit, for "
            "something only a thread of its own could do -- and `Thread-1 (producer)` ended "
            "with an error (below): what it would have done next (a put, a get, a "
            "task_done(), a release, a set) never comes") in err, err
    # (before: the consumer's get() on the queue.Queue was no recorded wait)
    assert ("count_words_threads.py's Thread-2 (consumer) waits: get() on queue.Queue 1: "
            "nothing in it yet -- count_words_threads.py's Thread-1 (producer) must put -- but "
            "it has ended") in err, err
    assert ("count_words_threads.py's main thread waits: join thread Thread-2 (consumer) -- "
            "count_words_threads.py's Thread-2 (consumer) must finish") in err, err
    assert re.search(r"thread `Thread-2 \(consumer\)`: waits for a lock of its own process, .* "
                     r"-- at consumer \(count_words_threads\.py:19\): `while \(text := "
                     r"q\.get\(\)\) is not None:`", err), err
    assert re.search(r"    thread `Thread-2 \(consumer\)`: wait \(threading\.py:\d+\) <- get "
                     r"\(queue\.py:\d+\) <- consumer \(count_words_threads\.py:19\)", err), err
    assert ("ENDED BY AN ERROR: count_words_threads.py's thread `Thread-1 (producer)` ended "
            "with FileNotFoundError: [Errno 2] No such file or directory: 'b.txt', raised at "
            "producer (count_words_threads.py:13)") in err, err


@pytest.mark.timeout(150)
def test_a_get_behind_the_read_lock_of_a_terminated_reader_is_not_said_empty(runs):
    # Said before: "Process-2's main thread waits: get() on Queue 1: nothing in it yet --
    # replace_worker_with_terminate.py's main thread must put" -- false twice: three tasks
    # were in Queue 1, put by that very thread; the get waited for the queue's read lock, which
    # the worker terminate() killed inside its own get() held for ever.
    err = hung(result(runs, "replace_worker_with_terminate.py"))
    assert ("Process-2's main thread waits: get() on Queue 1: 3 messages wait in it, but this "
            "get() waits for the queue's read lock -- Process-1's main thread must release "
            "Queue 1's read lock -- but it has ended; it took it in its own get(): only one "
            "reader at a time reads a Queue, and a lock held by a process that ended (killed by "
            "SIGTERM) inside get() is never released: every get() on Queue 1 waits for ever. "
            "Fix: never terminate() a process that may be inside a queue's get() or put()") \
        in err, err
    assert "Queue 1: nothing in it yet" not in err, err
    # ... and the timeline's label of that wait says the same
    import mpviz.trace as mt
    from mpviz.viz import timeline
    trace = mt.load(re.search(r"recording into (\S+) \(", err).group(1))
    texts = [t.get_text() for t in timeline(trace).axes[0].texts]
    assert any(t.startswith("waits: get() on Queue 1: 3 messages wait in it, but this get() "
                            "waits for the queue's read lock") for t in texts), texts
    assert ("replace_worker_with_terminate.py's main thread waits: get() on Queue 2: nothing in "
            "it yet -- Process-1's main thread must put -- but it has ended; Process-2 was given "
            "Queue 2 too, but waits itself (see its line): no put before that wait ends") in err, \
        err


@pytest.mark.timeout(150)
def test_threads_that_loop_on_a_queue_get_and_are_joined_are_a_cycle_with_the_fix(runs):
    # Before: "its threads wait for each other (a lock taken twice, a join of a thread that
    # waits for the joiner, ...)" and the main thread's join alone: the threads' get() on the
    # queue.Queue was not recorded, so nothing said who must put.
    res = result(runs, "fetch_without_sentinel.py")
    err = hung(res)
    assert "fetched 10 pages" in res.stdout, res.stdout
    assert ("fetch_without_sentinel.py: its threads wait for each other: 3 threads wait in "
            "get() on queue.Queue 1, with nothing in it, and every thread that put into it "
            "waits too") in err, err
    assert "put one sentinel per worker thread (`q.put(None)`)" in err, err
    for k in (1, 2, 3):
        assert (f"fetch_without_sentinel.py's Thread-{k} (fetch) waits: get() on queue.Queue 1: "
                f"nothing in it yet -- fetch_without_sentinel.py's main thread must put") in err
    assert ("STUCK FOR GOOD: a cycle: fetch_without_sentinel.py's main thread waits in join() "
            "for fetch_without_sentinel.py's Thread-1 (fetch) to finish; "
            "fetch_without_sentinel.py's Thread-1 (fetch) waits in get() on queue.Queue 1 for "
            "fetch_without_sentinel.py's main thread to put. Each waits for the next: none "
            "can go on -- and behind them, ") in err, err
    assert "tq-" not in err, err                      # (never an internal id)


@pytest.mark.timeout(150)
def test_the_queue_docs_worker_that_raised_is_who_q_join_waits_for(runs):
    # Before: only "every thread left waits ... `Thread-1 (worker)` ended with an error": the
    # q.join() on the queue.Queue was no recorded wait, and who must call task_done() unsaid.
    err = hung(result(runs, "queue_docs_worker_raises.py"))
    assert re.search(r"queue_docs_worker_raises.py's main thread waits: q.join\(\) on "
                     r"queue.Queue 1: until every item is task_done\(\) \((10|[1-9]) unfinished "
                     r"when join\(\) began\) -- queue_docs_worker_raises.py's Thread-1 \(worker\) "
                     r"must call task_done\(\) -- but it has ended", err), err
    try:
        100 // 0
    except ZeroDivisionError as e:         # (this Python's words: 3.14 says "division by zero")
        words = str(e)
    assert (f"ENDED BY AN ERROR: queue_docs_worker_raises.py's thread `Thread-1 (worker)` ended "
            f"with ZeroDivisionError: {words}, raised at worker "
            f"(queue_docs_worker_raises.py:14)") in err, err


@pytest.mark.timeout(150)
def test_a_thread_that_sleeps_before_its_put_leaves_no_cycle_said(runs):
    # The main thread joins the logger thread, which waits in get() on the queue.Queue the main
    # thread put into -- a cycle only if no other thread could put: the sensor thread sleeps
    # 3 s and then puts. Said, in the first version of the queue.Queue waits: "STUCK FOR
    # GOOD: a cycle" -- false.
    err = hung(result(runs, "slow_sensor_thread.py"))
    assert "HANG: STALLED" in err, err
    assert "STUCK FOR GOOD" not in err and "DEADLOCK" not in err, err
    # (the sensor thread was given the queue and has not put yet: it is named too)
    assert ("slow_sensor_thread.py's Thread-2 (logger) waits: get() on queue.Queue 1: nothing "
            "in it yet -- slow_sensor_thread.py's main thread or slow_sensor_thread.py's "
            "Thread-1 (sensor) must put") in err, err
    assert "in `time.sleep` (a deadline)" in err and "`time.sleep(3)`" in err, err


@pytest.mark.timeout(150)
def test_a_threading_lock_taken_twice_says_how_to_see_it_and_then_is_a_cycle_of_one(runs):
    # Without --threading-locks the verdict cannot know which lock: it said the list of
    # possible causes and no more. Now it says how to record them; with them, the thread that
    # waits for the lock it holds is a cycle of one ("Each waits for the next" before).
    err = hung(result(runs, "account_lock_taken_twice.py"))
    assert "--threading-locks ...` (or `record(threading_locks=True)`) records them" in err, err
    assert "report (account_lock_taken_twice.py:11): `with self.lock:`" in err, err
    err = hung(result(runs, "account_lock_taken_twice.py locks"))
    assert "--threading-locks ...`" not in err, err
    # (which of the two threads takes the lock first is a race; the cycle is of a lock alone,
    # with a join behind it: the lock rule's words, and its fix)
    me = r"account_lock_taken_twice.py's Thread-[12] \(deposit\)"
    assert re.search(rf"STUCK FOR GOOD: {me} waits for threading.Lock 1, which it holds itself: "
                     rf"a Lock is not re-entrant \(a second acquire\(\) before its release\(\) "
                     rf"waits for ever\)\. Fix: release it on every path", err), err


@pytest.mark.timeout(150)
def test_consumers_waiting_for_items_put_after_the_with_block_are_told_with_the_fix(runs):
    # Before: "its threads wait for each other (a lock taken twice, a join of a thread that
    # waits for the joiner, ...)" -- none of these; no thread had put into the queue at all.
    err = hung(result(runs, "consumers_fed_after_with.py"))
    assert ("consumers_fed_after_with.py: 3 threads wait in get() on queue.Queue 1, which no "
            "thread has put into yet -- and every other thread of it waits too, with no time "
            "limit (below): nothing will ever be put. Fix: put into it before waiting for the "
            "threads that get from it (a join(), or the end of a `with ThreadPoolExecutor(...)` "
            "block, which waits for its tasks)") in err, err
    assert "a lock taken twice" not in err, err
    for k in range(3):
        assert (f"consumers_fed_after_with.py's ThreadPoolExecutor-0_{k} waits: get() on "
                f"queue.Queue 1: nothing in it yet -- someone must put into queue.Queue 1, and "
                f"no thread has put into it yet") in err, err


@pytest.mark.timeout(150)
def test_a_put_on_a_full_bounded_queue_queue_whose_getter_raised_names_it(runs):
    # Before: only the join of the reader and the writer's error: the reader's put() on the
    # full queue.Queue was no recorded wait.
    err = hung(result(runs, "bounded_queue_writer_raises.py"))
    assert ("bounded_queue_writer_raises.py's Thread-1 (read) waits: put() on queue.Queue 1: it "
            "is full (2 items) -- bounded_queue_writer_raises.py's Thread-2 (write) must get -- "
            "but it has ended") in err, err
    assert "`Thread-2 (write)` ended with ValueError: cannot write 'BAD C'" in err, err



@pytest.mark.timeout(150)
def test_a_thread_an_exception_ended_is_marked_on_its_lane_with_the_error(runs, fonts_loaded):
    # Before: the writer thread's lane just ended, as if the thread had finished its work.
    from test_viz_truth import crosses, lane
    from mpviz import viz
    err = hung(result(runs, "bounded_queue_writer_raises.py"))
    fig = viz.timeline(mt.load(re.search(r"recording into (\S+) \(", err).group(1)))
    where, words = crosses(fig)
    assert words == ["✗ thread ended: ValueError: cannot write 'BAD C'"], words
    assert [row for _, row in where] == [lane(fig, "└ Thread-2 (write)")], where


@pytest.mark.timeout(150)
def test_a_main_thread_that_sleeps_before_its_put_leaves_no_cycle_said(runs):
    # The collector put into the queue and joins the parser, which waits in get(): a cycle of
    # two threads -- were it not for the main thread, which sleeps and then puts. Said before:
    # "STUCK FOR GOOD: a cycle" under a STALLED verdict (a main thread has no thread.start, so
    # it was not counted among the threads that may still act).
    err = hung(result(runs, "parser_fed_by_main_later.py"))
    assert "HANG: STALLED" in err, err
    assert "STUCK FOR GOOD" not in err and "DEADLOCK" not in err, err


@pytest.mark.timeout(150)
def test_a_worker_process_in_get_joined_after_stop_set_is_one_cycle_with_the_fix(runs):
    # Before: two lines, true but apart -- the worker's get() waits for the main thread to put,
    # the main thread's join waits for the worker -- and no cycle: a multiprocessing Queue's get
    # was left out of cycles (another process might put)
    res = result(runs, "stop_event_worker.py")
    err = hung(res)
    assert "[0, 1, 4, 9, 16]" in res.stdout, res.stdout
    assert "HANG: DEADLOCK" in err, err
    assert ("STUCK FOR GOOD: a cycle: stop_event_worker.py's main thread waits in join() for "
            "Process-1 to exit; Process-1's main thread waits in get() on Queue 1 for "
            "stop_event_worker.py's main thread to put. Each waits for the next: none can go "
            "on. A process that loops on `q.get()` never ends by itself, and a stop Event it "
            "checks between items is never seen while it waits inside get(). Fix: before "
            "join(), put one sentinel per worker (`q.put(None)`)") in err, err
    assert "sem-" not in err, err                     # (never an internal id)


@pytest.mark.timeout(150)
def test_a_producer_process_still_asleep_leaves_the_stop_event_worker_no_cycle(runs):
    # the same get() and join, but a second process given the queue sleeps before its put: it
    # may still put, so nobody is stuck for good (the rule: every live thread of every process
    # must be in the knot for a multiprocessing Queue's get() to be in it). Who must put names
    # the producer too (given the queue, not yet put, not waiting): it said the main thread only
    err = hung(result(runs, "stop_event_late_producer.py"))
    assert "HANG: STALLED" in err, err
    assert "STUCK FOR GOOD" not in err and "DEADLOCK" not in err, err
    assert "`time.sleep(30)`" in err, err
    assert ("Process-1's main thread waits: get() on Queue 1: nothing in it yet -- "
            "stop_event_late_producer.py's main thread or Process-2's main thread must put") \
        in err, err


@pytest.mark.timeout(150)
def test_a_worker_joined_before_its_sentinel_is_sent_gets_the_sentinel_fix_not_an_event(runs):
    # the first words of this cycle's fix spoke of "a stop Event it checks between items" for
    # every such program -- false for one with no Event, which only forgot its None
    err = hung(result(runs, "squares_sentinel_forgotten.py"))
    assert ("STUCK FOR GOOD: a cycle: squares_sentinel_forgotten.py's main thread waits in "
            "join() for Process-1 to exit; Process-1's main thread waits in get() on Queue 1 "
            "for squares_sentinel_forgotten.py's main thread to put. Each waits for the next: "
            "none can go on. A process that loops on `q.get()` ends only when it gets what it "
            "stops at, and nothing more will be put. Fix: before join(), put one sentinel per "
            "worker (`q.put(None)`, what `iter(q.get, None)` stops at)") in err, err
    assert "Event" not in err, err


@pytest.mark.timeout(150)
def test_a_queue_reached_through_a_global_never_blames_the_thread_that_put_and_ended(runs):
    # Three threads put into a module-level queue.Queue; the first ends holding the lock the
    # other two wait for. Said before: "Thread-1 (fetch_and_keep_lock) must put -- but it has
    # ended" -- false: it put its one result; the two that must put wait for its lock, and
    # mpviz never saw them use the queue (a global: no argument, no put yet).
    err = hung(result(runs, "results_via_global.py"))
    assert "HANG: DEADLOCK" in err, err
    assert ("results_via_global.py's main thread waits: get() on queue.Queue 1: nothing in it "
            "yet -- results_via_global.py's Thread-1 (fetch_and_keep_lock) put into it and "
            "has ended: no thread seen putting into it can put again. A thread that reaches "
            "queue.Queue 1 another way (a global, a closure, an attribute) is seen only once it "
            "puts: the stacks above say where each thread is") in err, err
    assert "must put -- but it has ended" not in err, err
    assert "at fetch (results_via_global.py:11): `with db_lock:`" in err, err


@pytest.mark.timeout(150)
def test_a_worker_that_put_and_ended_well_is_not_said_to_owe_a_put(runs):
    # Said before: "Process-1's main thread must put -- but it has ended" -- it put all four
    # results and ended (exit 0); the four the parent still waits for would have come from a
    # second worker it never started (module-level queues: nothing was given as an argument)
    res = result(runs, "worker_never_started.py")
    err = hung(res)
    assert ("worker_never_started.py's main thread waits: get() on Queue 2: nothing in it yet "
            "-- Process-1's main thread put into it and has ended: no thread seen putting into "
            "it can put again. A process or thread that reaches Queue 2 another way (a global, "
            "which a forked child inherits; a closure; an attribute) is seen only once it "
            "puts") in err, err
    assert "must put -- but it has ended" not in err, err


@pytest.mark.timeout(150)
def test_a_spawned_child_waiting_on_its_own_module_level_event_is_told_so(runs):
    # Said before: only "someone must set Event 1, and nobody has set it yet" -- true of the
    # child's Event, but silent on the stop.set() the learner sees in the parent: under spawn
    # the child made its own Event when it imported the module
    err = hung(result(runs, "spawn_global_event.py"))
    assert ("Process-1's main thread waits: Event 1.wait() -- someone must set Event 1, and "
            "nobody has set it yet; spawn_global_event.py's main thread set an Event, but "
            "another one, which nobody waits on: most likely the same module-level Event, made "
            "again when this child (started by spawn) imported the program's module") in err, err
    assert "pass it to the child as a Process argument" in err, err


@pytest.mark.timeout(150)
def test_a_child_given_its_event_is_not_told_of_a_module_level_one(runs):
    # The first words of the hint above said "most likely the same module-level Event ... pass
    # it to the child as a Process argument" to a program that had passed it -- false; the
    # parent had set another Event
    err = hung(result(runs, "wrong_event_set.py"))
    assert ("SpawnProcess-1's main thread waits: Event 1.wait() -- someone must set Event 1, "
            "and nobody has set it yet; wrong_event_set.py's main thread set an Event, but "
            "another one, which nobody waits on -- SpawnProcess-1 was given this one as a "
            "Process argument: set that one") in err, err
    assert "module-level" not in err, err


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_waiting_on_a_threading_event_is_told_it_has_its_own_copy(runs, method):
    # Said before, under fork: "forked by ...; a lock it waits for was copied held, or its
    # threads wait for each other", then "Fix: start the children with 'spawn' or
    # 'forkserver'" -- false, and spawn hangs the same; under spawn: "its threads wait for each
    # other (a lock taken twice, ...)" -- it has one thread.
    err = hung(result(runs, f"start_signal_threading_event.py {method}"))
    child = f"{method.capitalize()}Process-1"
    assert (f"{child} waits in a threading.Event's wait() (work "
            f"(start_signal_threading_event.py:12): `start.wait()`): a threading.Event lives in "
            f"one process's memory -- each process has a copy of its own (fork copies it, spawn "
            f"makes a new one), which only a thread of that process can set; a set() in another "
            f"process sets that process's own. Fix: a multiprocessing Event "
            f"(`multiprocessing.Event()`, or your context's), made before the Process is "
            f"started and passed to it as an argument.") in err, err
    assert "copied held" not in err and "wait for each other" not in err, err
    assert "start the children with 'spawn'" not in err, err


@pytest.mark.timeout(150)
def test_a_wait_for_whose_condition_is_never_met_is_not_told_to_use_wait_for(runs):
    # Said before: "its last notify_all() ... came 0.0 s before this wait began and woke nobody:
    # a notify wakes only the threads already waiting. Fix: ... or cond.wait_for(...)" -- to a
    # program that waits with wait_for(), which checks its condition before waiting: the
    # notifies were not lost, the condition (count >= 3) was false.
    err = hung(result(runs, "count_reaches_three.py"))
    assert re.search(r"Process-1's main thread waits: Condition 1\.wait_for\(\) -- someone must "
                     r"make its wait_for\(\) condition true and notify Condition 1 again; its "
                     r"last notify_all\(\), by count_reaches_three\.py's main thread, came "
                     r"\d+\.\d s before this wait began, and wait_for\(\) checked its condition "
                     r"after it and found it false", err), err
    assert "cond.wait_for(...)" not in err and "woke nobody" not in err, err
    assert "`cond.wait_for(lambda: count.value >= 3)`" in err, err      # (its line)



@pytest.mark.timeout(150)
def test_a_threading_event_of_the_programs_own_process_is_not_said_to_be_a_copy(runs):
    # The child's words ("has a copy of its own ... a set() in another process") said to a
    # program of one process, by the first version of the threading.Event verdict -- false
    err = hung(result(runs, "ready_never_given.py"))
    assert ("ready_never_given.py waits in a threading.Event's wait() (serve "
            "(ready_never_given.py:8): `ready.wait()`), which only a thread of "
            "ready_never_given.py can set -- and every thread of ready_never_given.py waits (the "
            "stacks say where): nobody is left to set it.") in err, err
    assert "copy of its own" not in err and "multiprocessing.Event()" not in err, err


@pytest.mark.timeout(150)
def test_a_queue_queue_a_child_puts_into_is_its_own(runs):
    """A queue.Queue (the threads' queue) given to a forked child, or made at the top of the
    module, which a child under spawn makes again: the child's put() goes into its own, and
    the parent's get() waits for ever. Said before: "1 thread waits in get() on queue.Queue 1,
    which no thread has put into yet ... Fix: put into it before waiting for the threads that
    get from it (a join() ...), or give that get() a timeout" -- false: the children did put,
    and neither fix mends it."""
    runs_of = {"total_via_thread_queue.py": ["Process-1"],
               "file_checks_module_queue.py fork": ["ForkProcess-1", "ForkProcess-2"],
               "file_checks_module_queue.py spawn": ["SpawnProcess-1", "SpawnProcess-2"],
               "downloads_into_module_queue.py": ["SpawnProcess-1", "SpawnProcess-2"],
               "downloads_after_module_setup.py": ["SpawnProcess-1", "SpawnProcess-2"]}
    for name, children in runs_of.items():
        err = hung(result(runs, name))
        program = name.split()[0]
        who = " and ".join(fr"{child} \(pid \d+\)" for child in children)
        assert re.search(
            rf"{re.escape(program)}: 1 thread waits in get\(\) on queue\.Queue \d, which no "
            rf"thread of it has put into -- and {who} put into a queue\.Queue that no thread "
            rf"of (it|them) gets from: a queue\.Queue lives in one process's memory", err), err
        assert ("Fix: a multiprocessing Queue (`multiprocessing.Queue()`, or your context's), "
                "made before the Process is started and passed to it as an argument.") in err, err
        assert "give that get() a timeout" not in err, err
        # ... and the line of who waits for whom, which said "no thread has put into it yet"
        plural = "queue.Queues of their" if len(children) > 1 else "a queue.Queue of its"
        assert re.search(
            rf"someone must put into queue\.Queue \d, and no thread of its process has put into "
            rf"it -- {' and '.join(children)} put into {plural} own \(a queue\.Queue lives in "
            rf"one process's memory\)", err), err
    # its wait-for graph: the parent's get() on the queue.Queue, by its name (it drew none:
    # a queue.Queue's wait had no node, and its name would have been its id, "tq-<pid>-1")
    import matplotlib
    matplotlib.use("Agg")
    from mpviz import viz
    run = result(runs, "total_via_thread_queue.py")
    fig = viz.wait_for(mt.load(run.args[run.args.index("-o") + 1]))
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert "queue.Queue 1\nempty: no thread of its process has put into it yet" in texts, texts
    assert not [t for t in texts if "tq-" in t], texts


@pytest.mark.timeout(150)
def test_a_threading_semaphore_condition_or_barrier_in_a_child_is_its_own(runs):
    """The threading.Event rule, for the other objects of threading a child may wait on: a
    Semaphore's acquire(), a Condition's wait(), a Barrier's wait(). Said before, under fork:
    "forked by ...; a lock it waits for was copied held ... Fix: start the children with
    'spawn' or 'forkserver'" -- false, spawn hangs the same; under spawn: "its threads wait for
    each other (a lock taken twice ...)" -- of a process with one thread."""
    cases = {"slots_threading_semaphore.py fork": (
                 "ForkProcess-1 waits", "Semaphore", "acquire()",
                 "work (slots_threading_semaphore.py:12): `slots.acquire()`",
                 "release; a release() in another process releases", "Semaphore()"),
             "batch_ready_condition.py fork": (
                 "ForkProcess-1 waits", "Condition", "wait()",
                 "load (batch_ready_condition.py:14): `ready.wait()`",
                 "notify; a notify() in another process notifies", "Condition()"),
             "phases_threading_barrier.py": (
                 "ForkProcess-1 and ForkProcess-2 wait", "Barrier", "wait()",
                 "phase (phases_threading_barrier.py:11): `both_ready.wait()`",
                 "arrive at; a wait() in another process arrives at", "Barrier(parties)")}
    for name in ("slots_threading_semaphore.py", "batch_ready_condition.py"):
        cases[f"{name} spawn"] = ("SpawnProcess-1 waits",) + cases[f"{name} fork"][1:]
    for name, (who, kind, call, line, verbs, make) in cases.items():
        err = hung(result(runs, name))
        if kind == "Barrier" and who not in err:
            # (the two reach the barrier a few ms apart: the watchdog may judge the first
            # alone, the second a look later -- "ForkProcess-2 waits ...", or the other way)
            who = re.search(r"ForkProcess-\d waits(?= in a threading\.Barrier)", err)
            who = who.group(0) if who else "ForkProcess-1 and ForkProcess-2 wait"
        assert (f"{who} in a threading.{kind}'s {call} ({line}): a threading.{kind} lives in "
                f"one process's memory -- each process has a copy of its own (fork copies it, "
                f"spawn makes a new one), which only a thread of that process can {verbs} that "
                f"process's own. Fix: a multiprocessing {kind} (`multiprocessing.{make}`, or "
                f"your context's), made before the Process is started and passed to it as an "
                f"argument.") in err, err
        assert "start the children with 'spawn'" not in err, err
        assert "its threads wait for each other" not in err, err


@pytest.mark.timeout(150)
def test_a_threading_condition_whose_notifier_raised_names_the_thread_that_raised(runs):
    """One process: the main thread waits on a threading.Condition; the thread that would
    notify it raised. The rule for a threading object's wait in the program's own process
    said only "nobody is left to notify it" (it was tried on a program whose threads all
    wait); the story is the thread that raised, and it is told."""
    err = hung(result(runs, "config_loaded_condition.py"))
    assert ("config_loaded_condition.py: every thread left waits, with no time limit, for "
            "something only a thread of its own could do -- and `loader` ended with an error"
            ) in err, err
    assert "nobody is left to notify it" not in err, err


@pytest.mark.timeout(150)
def test_a_joinable_queue_whose_items_are_never_marked_done_says_so(runs):
    """Workers that got every item and wait in get() for more while q.join() waits: an item got
    was never task_done(). Said before: "Process-1's main thread or Process-2's main thread must
    call task_done()" -- and nothing of why they never will."""
    err = hung(result(runs, "thumbnails_no_task_done.py"))
    assert re.search(
        r"thumbnails_no_task_done\.py's main thread waits: q\.join\(\) on Queue 1: until every "
        r"item is task_done\(\) -- (Process-\d's main thread( or )?)+ must call task_done\(\) -- "
        r"but (it|they) got every item put into Queue 1 and now waits? in its get\(\) for more: "
        r"q\.join\(\) ends when task_done\(\) has been called once for each item put", err), err
    assert "Fix: call q.task_done() once for every item a worker gets, after handling it" in err


@pytest.mark.timeout(150)
def test_an_item_the_feeder_could_not_pickle_is_named_where_its_getter_or_join_waits(runs):
    """put() returns at once; the feeder thread pickles later, and drops what it cannot (it
    prints the error in the putting process and raises nothing). A get() then waits for an
    item that is not coming, a q.join() for items nobody can get. Said before: "... main
    thread must put" and, for the join, "who must act is not recorded" -- though the putter
    had put, and the error was recorded."""
    err = hung(result(runs, "jobs_with_callbacks.py"))
    assert ("q.join() on Queue 1: until every item is task_done() -- nobody has got from it -- "
            "jobs_with_callbacks.py put 3 items into Queue 1 that never reached it: the feeder "
            "thread could not pickle them (PicklingError: Can't pickle <function <lambda>>: "
            "attribute lookup <lambda> on __main__ failed) and dropped them") in err, err
    assert "q.join() counts a dropped item unfinished for ever" in err, err
    assert "who must act is not recorded" not in err, err
    # the wait-for graph says it too, at both waits' queue (it said only "empty" and "not
    # every item is task_done()": the main thread "must put", which it had)
    import matplotlib
    matplotlib.use("Agg")
    from mpviz import viz
    run = result(runs, "jobs_with_callbacks.py")
    fig = viz.wait_for(mt.load(run.args[run.args.index("-o") + 1]))
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert ("Queue 1 (a JoinableQueue)\nnot every item is task_done()\n3 put, dropped by its "
            "feeder (could not pickle)") in texts, texts
    assert "Queue 1\nempty\n3 put, dropped by its feeder (could not pickle)" in texts, texts
    err = hung(result(runs, "log_file_on_task_queue.py"))
    assert ("Process-1's main thread waits: get() on Queue 1: nothing in it yet -- "
            "log_file_on_task_queue.py's main thread must put -- and log_file_on_task_queue.py "
            "put an item into Queue 1 that never reached it: the feeder thread could not pickle "
            "it (TypeError: cannot pickle '_io.TextIOWrapper' object) and dropped it") in err, err
    assert "What was dropped is not coming. Fix: put only what can be pickled" in err, err


@pytest.mark.timeout(150)
def test_two_processes_taking_two_locks_in_opposite_orders_get_the_cycle_and_its_fix(runs):
    """The classic lock-order deadlock, as a bank-transfer program writes it. The cycle was
    found before; its fix was not said."""
    err = hung(result(runs, "transfer_two_locks.py"))
    assert re.search(
        r"STUCK FOR GOOD: a cycle: Process-(\d)'s main thread waits for Lock (\d), which "
        r"Process-(?!\1)\d's main thread holds; Process-(?!\1)\d's main thread waits for Lock "
        r"(?!\2)\d, which Process-\1's main thread holds\. Each waits for the next: none can go "
        r"on\. Fix: take the locks in one order everywhere \(every process and thread takes "
        r"Lock 1 before Lock 2, say -- or sort them by a key first\), or hold only one at a "
        r"time", err), err
    assert "at transfer (transfer_two_locks.py:10): `with dst_lock:`" in err, err


@pytest.mark.timeout(150)
def test_messages_the_feeder_dropped_are_named_when_the_program_ends_well(runs):
    """Nothing hangs -- the None after them arrives -- and the program prints that all went
    well; but neither task reached the worker. Said before: "24 events from 2 processes"."""
    run = result(runs, "resize_tasks_with_log.py")
    assert run.returncode == 0 and "all tasks sent" in run.stdout, run.stderr
    assert ("resize_tasks_with_log.py (pid " in run.stderr and
            ") put 2 messages into Queue 1 that never reached it: the feeder thread could not "
            "pickle them (TypeError: cannot pickle '_io.TextIOWrapper' object) and dropped them "
            "-- put() had returned, and nothing was raised in the program. Fix: put only what "
            "can be pickled") in run.stderr, run.stderr


@pytest.mark.timeout(150)
def test_a_program_that_ends_without_stopping_its_loop_waits_at_exit_and_is_told_so(runs):
    """A thread (not daemon) or a process that loops on get(), never told to stop: the program's
    last line has run, and Python waits at exit for it. Said before, of the thread: "its threads
    wait for each other (a lock taken twice, a join of a thread that waits for the joiner
    ...)" -- none of which the program did."""
    err = hung(result(runs, "printer_thread_not_stopped.py"))
    assert ("printer_thread_not_stopped.py: its main thread has run the program to its end and "
            "waits, at exit, for the thread not made with daemon=True to end -- Python waits for "
            "every such thread -- and `Thread-1 (printer)` (it waits: get() on queue.Queue 1: "
            "nothing in it yet) never ends: a loop waiting for more work ends only when it is "
            "told to stop. Fix: tell it to stop before the program ends (a sentinel, "
            "`q.put(None)`, that its loop returns on; or an Event it checks) and join() it; or "
            "make it a daemon thread (`daemon=True`)") in err, err
    assert "a lock taken twice" not in err, err
    # a thread waiting for an Event at exit: the at-exit story comes before the threading
    # object's ("... nobody is left to set it", which said nothing of the end, nor a fix)
    err = hung(result(runs, "flush_on_stop_event.py"))
    assert ("flush_on_stop_event.py: its main thread has run the program to its end and waits, "
            "at exit, for the thread not made with daemon=True to end -- Python waits for every "
            "such thread -- and `watcher` (it waits: a threading.Event's wait(), at watcher "
            "(flush_on_stop_event.py:9): `stop.wait()`) never ends. Fix: tell it to stop") in err
    assert "nobody is left to set it" not in err, err
    err = hung(result(runs, "server_never_stopped.py"))
    assert "server_never_stopped.py's main thread waits: join Process-1 (pid " in err, err
    assert re.search(r"STUCK FOR GOOD: a cycle: server_never_stopped\.py's main thread waits in "
                     r"join\(\) for Process-1 to exit; Process-1's main thread waits in get\(\) "
                     r"on Queue 1 for server_never_stopped\.py's main thread to put\. .* Fix: "
                     r"before join\(\), put one sentinel per worker", err), err


@pytest.mark.timeout(150)
def test_pool_tasks_that_raised_unseen_are_named_when_the_program_ends_well(runs):
    """apply_async() results (or a ProcessPoolExecutor's futures) never asked for: each task's
    FileNotFoundError stays in its result, and the program says "all files parsed". Said
    before: "57 events from 3 processes"."""
    run = result(runs, "parse_files_apply_async.py")
    assert run.returncode == 0 and "all files parsed" in run.stdout, run.stderr
    assert ("2 Pool tasks raised, and the program ended with status 0: parse (job 0) raised "
            "FileNotFoundError: [Errno 2] No such file or directory: 'missing_a.txt'; parse (job "
            "1) raised FileNotFoundError: [Errno 2] No such file or directory: 'missing_b.txt' "
            "-- and the program never saw these errors: no .get() of their results raised them, "
            "and no error_callback was given. A Pool keeps a task's exception in its result, and "
            "only the result's .get() raises it") in run.stderr, run.stderr
    assert "Fix: call .get() on every AsyncResult apply_async() returns" in run.stderr
    run = result(runs, "parse_files_executor.py")
    assert run.returncode == 0 and "all files parsed" in run.stdout, run.stderr
    assert ("2 ProcessPoolExecutor tasks raised, and the program ended with status 0: parse "
            "raised FileNotFoundError: [Errno 2] No such file or directory: 'missing_a.txt'; "
            "parse raised FileNotFoundError: [Errno 2] No such file or directory: "
            "'missing_b.txt' -- and the program never saw these errors: no .result() of their "
            "futures raised them, and no .exception() returned them. A future keeps its task's "
            "exception, and only its .result() raises it") in run.stderr, run.stderr


@pytest.mark.timeout(150)
def test_a_model_forked_without_share_memory_is_named_as_each_workers_own_copy(runs):
    """Hogwild without model.share_memory(): each forked worker's optimizer steps its own
    copy, the main process's model never learns, and nothing fails. Said before: "20 events
    from 3 processes". With share_memory() (or under spawn, where torch shares what it
    pickles), nothing is said."""
    run = result(runs, "hogwild_forgot_share_memory.py")
    assert run.returncode == 0 and "the model learned: False" in run.stdout, run.stderr
    assert re.search(
        r"Process-1 \(pid \d+\) and Process-2 \(pid \d+\) were forked with Linear \(2 "
        r"tensors, 20 B\) among what they were given \(arguments, or the object whose method is "
        r"the target\), not in shared memory: each has a copy of its "
        r"own \(fork copies memory page by page as it is written\) -- what one writes into "
        r"them \(an optimizer's step\), the parent and the others never see\. Fix, if they "
        r"are to be shared: model\.share_memory\(\)", run.stderr), run.stderr
    run = result(runs, "hogwild_forgot_share_memory.py share")
    assert run.returncode == 0 and "the model learned: True" in run.stdout, run.stderr
    assert "not in shared memory" not in run.stderr, run.stderr


@pytest.mark.timeout(150)
def test_a_result_got_after_its_pool_was_terminated_says_so_and_the_fix(runs):
    """map_async() or apply_async() inside `with Pool(...) as pool:`, the get() after the block
    -- whose __exit__ calls terminate(): the workers are killed and the job is dropped; or
    terminate() where close() was meant. Said before: "its threads wait for each other (a lock
    taken twice, a join of a thread that waits for the joiner, ...)" -- none of which the
    program did -- and "the result of Pool job 0 -- who must act is not recorded"."""
    for name, what, why in [
            ("squares_after_with.py", r"Pool job 0 \(slow_square: \d of its 8 tasks done\)",
             r"the Pool was terminated at the end of its `with` block \(<module> "
             r"\(squares_after_with\.py:12\): `with Pool\(4\) as pool:`\): a Pool's __exit__ "
             r"calls terminate\(\), not close\(\) and join\(\)"),
            ("thumbnails_after_with.py", r"Pool job \d \(make_thumbnail: 0 of its 1 task done\)",
             r"the Pool was terminated at the end of its `with` block \(<module> "
             r"\(thumbnails_after_with\.py:13\)"),
            ("scores_pool_terminate.py", r"Pool job 0 \(score: \d of its 4 tasks done\)",
             r"the program called the Pool's terminate\(\) \(<module> "
             r"\(scores_pool_terminate\.py:16\): `pool\.terminate\(\)`\) before the job was "
             r"done")]:
        err = hung(result(runs, name))
        program = re.escape(name)
        assert re.search(
            rf"  {program} waits for the result of {what}, which will never come: {why}.*; "
            rf"terminate\(\) kills the workers and drops every job not finished\. Fix: ", err), err
        assert re.search(rf"{program}'s main thread waits: the result of Pool job \d -- nobody "
                         rf"can: {what} will never finish: {why}", err), err
        assert "its threads wait for each other" not in err, err
        assert "who must act is not recorded" not in err, err
        # its workers were killed by terminate(): none is "idle, not stuck" (a race decided
        # whether one was still in its first get() when killed; said of a dead worker before)
        assert "is idle, not stuck" not in err, err
    assert ("Fix: get the results inside the `with` block (`.get()` before it ends), or call "
            "pool.close() and pool.join() as its last lines: they wait for the jobs."
            ) in hung(result(runs, "squares_after_with.py"))
    assert ("Fix: get the results before terminate(), or end the Pool with close() and join(), "
            "which wait for its jobs.") in hung(result(runs, "scores_pool_terminate.py"))
    err = hung(result(runs, "fetch_pages_threadpool.py"))   # threads: none is killed
    assert ("fetch_pages_threadpool.py waits for the result of ThreadPool job 0 (fetch: 0 of its "
            "3 tasks done), which will never come: the Pool was terminated at the end of its "
            "`with` block (<module> (fetch_pages_threadpool.py:14): `with ThreadPool(2) as "
            "pool:`): a Pool's __exit__ calls terminate(), not close() and join(); terminate() "
            "drops every job not finished (a ThreadPool's threads are not killed, but what they "
            "finish is never delivered). Fix: ") in err, err


@pytest.mark.timeout(150)
def test_a_pool_task_waiting_for_a_sentinel_main_never_put_is_a_cycle_with_its_fix(runs):
    """Main waits for a Pool task's result; the task loops on a Manager Queue's get() until
    None, which main never puts. The cycle was not found: the idle worker 1 counted as a
    process that might still put -- it runs only what main gives it."""
    err = hung(result(runs, "sum_via_manager_queue.py"))
    assert re.search(
        r"STUCK FOR GOOD: a cycle: sum_via_manager_queue\.py's main thread waits for the result "
        r"of Pool job 0, which worker \d's main thread runs; worker \d's main thread waits in "
        r"get\(\) on the Manager's Queue 1 \(kept in SyncManager-1, pid \d+\) for "
        r"sum_via_manager_queue\.py's main thread to put\. Each waits for the next: none can go "
        r"on\. A task that loops on `q\.get\(\)` ends only when it gets what it stops at, and "
        r"nothing more will be put\. Fix: before waiting for the result, put one sentinel per "
        r"worker \(`q\.put\(None\)`", err), err


@pytest.mark.timeout(150)
def test_a_parent_joining_workers_while_holding_their_lock_is_a_cycle_with_its_fix(runs):
    """The parent starts and joins its workers inside `with lock:`; each worker needs that
    lock to end. Said before: only the waits, one by one -- no cycle, no fix (a knot of a
    join and a lock was left to the lock-cycle rule, which sees locks alone)."""
    err = hung(result(runs, "count_under_lock_join.py"))
    assert re.search(
        r"STUCK FOR GOOD: a cycle: count_under_lock_join\.py's main thread waits in join\(\) for "
        r"Process-(\d) to exit; Process-\1's main thread waits for lock 'lock', which "
        r"count_under_lock_join\.py's main thread holds\. Each waits for the next: none can go "
        r"on -- and behind them, .*\. A thread waited for others while holding lock 'lock', "
        r"which they must take before they can end\. Fix: release it before the join\(\) -- "
        r"hold a lock only around the lines it guards", err), err


@pytest.mark.timeout(150)
def test_a_model_held_by_the_object_whose_method_each_worker_runs_is_named_too(runs):
    """Hogwild with the model in a Trainer object and `target=trainer.train`: the model is in
    no argument. Said before: "22 events from 3 processes" -- and the model never learned.
    With share_memory(), nothing is said."""
    run = result(runs, "hogwild_trainer_object.py")
    assert run.returncode == 0 and "the model learned: False" in run.stdout, run.stderr
    assert re.search(
        r"Process-1 \(pid \d+\) and Process-2 \(pid \d+\) were forked with Trainer\.model: "
        r"Linear \(2 tensors, 20 B\) among what they were given \(arguments, or the object "
        r"whose method is the target\), not in shared memory", run.stderr), run.stderr
    run = result(runs, "hogwild_trainer_object.py share")
    assert run.returncode == 0 and "the model learned: True" in run.stdout, run.stderr
    assert "not in shared memory" not in run.stderr, run.stderr


@pytest.mark.timeout(150)
def test_a_result_put_before_os_exit_is_said_lost_with_the_fix(runs):
    """`results.put(...)` then `os._exit(0)` in the worker: the feeder thread never writes the
    message (os._exit skips the exit where it is joined), and the parent's get() waits for
    ever. Said before: "its feeder thread never wrote it (the process ended first)", and no
    fix."""
    err = hung(result(runs, "result_then_os_exit.py"))
    assert ("result_then_os_exit.py's main thread waits: get() on Queue 1: nothing in it yet -- "
            "Process-1 put into Queue 1 and ended, but its message never reached the queue's "
            "pipe: its feeder thread never wrote it (the process ended first): Process-1 left "
            "by os._exit(), which skips the interpreter's exit -- where a Queue's feeder is "
            "joined and writes what is left.") in err, err
    assert ("Nothing is coming. Fix: return from the process's function (or sys.exit()), or "
            "call the queue's close() and join_thread() before os._exit()") in err, err
