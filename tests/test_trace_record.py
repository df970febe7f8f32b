"""Recording real processes under every start method (issue #4)."""
import multiprocessing as mp
import os
import subprocess
import sys
import time
import uuid
from multiprocessing import connection, queues

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import trace_workers as w  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz.trace import recorder  # noqa: E402
from mpviz.trace.testing import check_sequence_matches  # noqa: E402

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["fork", "spawn", "forkserver"])
def ctx(request):
    context = mp.get_context(request.param)
    yield context
    if request.param == "forkserver":       # the fork server is a child of ours: stop it
        from multiprocessing import forkserver
        forkserver._forkserver._stop()


def kinds_of(trace, pid, keep=None):
    return [e.kind for e in trace.events if e.pid == pid and (keep is None or e.kind in keep)]


def test_producer_consumer_every_start_method(ctx):
    segment = f"mpviz_test_{uuid.uuid4().hex[:8]}"
    with mt.record() as trace:
        q, results = ctx.Queue(), ctx.Queue()
        prod = ctx.Process(target=w.producer, args=(q, 5, segment), name="producer")
        cons = ctx.Process(target=w.consumer, args=(q, results, segment), name="consumer")
        prod.start()
        cons.start()
        got = results.get()
        prod.join()
        cons.join()
    assert got == [0, 1, 2, 3, 4]                          # the user gets exactly their objects
    me = os.getpid()
    procs = {p.pid: p for p in trace.processes()}
    assert {me, prod.pid, cons.pid} <= set(procs)
    for child, name in ((prod, "producer"), (cons, "consumer")):
        p = procs[child.pid]
        assert (p.name, p.how, p.ppid, p.exitcode) == (name, ctx.get_start_method(), me, 0)
    lifecycle = {"process.start", "process.bootstrap", "process.exit"}
    check_sequence_matches(kinds_of(trace, prod.pid, lifecycle | {"queue.put", "shm.create"}),
                           ["process.start", "process.bootstrap", "shm.create"]
                           + ["queue.put"] * 6 + ["process.exit"])
    check_sequence_matches(kinds_of(trace, cons.pid, lifecycle | {"queue.get", "mark"}),
                           ["process.start", "process.bootstrap"]
                           + ["queue.get", "mark"] * 5 + ["queue.get", "process.exit"])
    check_sequence_matches(
        kinds_of(trace, me, {"process.start", "process.launch", "process.reaped"}),
        ["process.start", "process.launch", "process.launch", {"process.reaped"} | set()]
        + ["process.reaped"])

    # every put reaches its get, across processes, with the same queue id
    flows = [f for f in trace.flows() if f.put.pid == prod.pid]
    assert len(flows) == 6
    for f in flows:
        assert f.get is not None and f.get.pid == cons.pid
        assert f.get.args["queue"] == f.put.args["queue"] and f.get.ts_ns > f.put.ts_ns
        assert f.nbytes > 0
    result_flow = [f for f in trace.flows() if f.put.pid == cons.pid]
    assert len(result_flow) == 1 and result_flow[0].get.pid == me

    (seg,) = [s for s in trace.segments() if s.name == segment]
    assert (seg.created_by, seg.attached_by, seg.detached_by) == (prod.pid, (cons.pid,),
                                                                   (cons.pid,))
    assert seg.strategy == "file_system" and seg.nbytes == 4096 and seg.unlinked_ns is None


def test_pool_workers_and_tasks(ctx):
    with mt.record() as trace:
        with ctx.Pool(2) as pool:
            assert pool.map(w.square, range(10), chunksize=3) == [x * x for x in range(10)]
            assert pool.apply_async(w.square, (7,)).get() == 49
            workers = [p.pid for p in pool._pool]
    tasks = trace.of_kind("pool.task")
    submits = [e for e in tasks if e.args["phase"] == "submit"]
    assert sorted(e.args["chunk"] for e in submits) == [1, 1, 3, 3, 3]
    assert all(e.args["func"] == "square" for e in tasks)
    for phase in ("start", "done"):
        ran = [e for e in tasks if e.args["phase"] == phase]
        assert len(ran) == 5 and {e.pid for e in ran} <= set(workers)
    recorded = {p.pid for p in trace.processes() if p.how == ctx.get_start_method()}
    assert set(workers) <= recorded


def test_lock_wait_and_hold_across_processes(ctx):
    with mt.record() as trace:
        lock, got_it = ctx.Lock(), ctx.Event()
        lock.acquire()
        child = ctx.Process(target=w.contend, args=(lock, got_it))
        child.start()
        # Release only once the child's lock.wait is in the trace: synchronised on the log.
        while not [e for e in trace.of_kind("lock.wait") if e.pid == child.pid]:
            trace.refresh()
            assert child.is_alive()
        lock.release()
        assert got_it.wait(30)
        child.join()
    (info,) = [lk for lk in trace.locks() if any(h.pid == child.pid for h in lk.holds)]
    first, second = info.holds
    assert (first.pid, second.pid, info.type) == (os.getpid(), child.pid, "Lock")
    assert second.wait_ns is not None and second.wait_ns < first.release_ns <= second.acquire_ns
    assert second.release_ns is not None and info.waiting == ()
    check_sequence_matches(kinds_of(trace, child.pid, {"lock.wait", "lock.acquire",
                                                       "lock.release"}),
                           ["lock.wait", "lock.acquire", "lock.release"])


def test_threads_in_a_child(ctx):
    with mt.record() as trace:
        p = ctx.Process(target=w.in_a_thread, args=(3,))
        p.start()
        p.join()
    starts = [e for e in trace.of_kind("thread.start") if e.pid == p.pid]
    assert [e.args["name"] for e in starts] == ["helper"]
    tid = starts[0].tid
    assert tid != p.pid
    check_sequence_matches([e.kind for e in trace.events if e.tid == tid],
                           ["thread.start", "mark", "mark", "mark", "thread.exit"])


def test_threading_locks_on_request():
    import threading
    with mt.record(threading_locks=True) as trace:
        lock = threading.Lock()
        with lock:
            pass
    with mt.record() as plain:
        with threading.Lock():
            pass
    check_sequence_matches([e.kind for e in trace.of_kind("lock.")],
                           ["lock.acquire", "lock.release"])
    assert plain.of_kind("lock.") == []
    assert threading.Lock is mt.locks._orig.get("threading.Lock", threading.Lock)


def test_a_lock_the_stdlib_makes_is_not_taken_for_the_users():
    # The stdlib makes locks of its own in modules no list names (a sched.scheduler's here;
    # 3.13's sysconfig one when first imported): where the lock is made says whose it is
    import sched
    import threading
    with mt.record(threading_locks=True) as trace:
        s = sched.scheduler()
        s.enter(0, 0, lambda: None)
        s.run()
        with threading.Lock():
            pass
    assert type(s._lock) is type(threading.RLock())        # the real lock, not a traced one
    check_sequence_matches([e.kind for e in trace.of_kind("lock.")],
                           ["lock.acquire", "lock.release"])       # only the user's


def test_a_file_in_any_site_directory_is_a_librarys_not_the_users():
    # Debian's Python keeps apt's packages in /usr/lib/python3/dist-packages, which is not
    # sysconfig's purelib (/usr/local's); pip install --user puts them in the user's site: a
    # lock one of them makes is the library's, as one a venv's site-packages' module makes is
    import site
    for directory in site.getsitepackages() + [site.getusersitepackages()]:
        assert mt.locks.in_library(os.path.join(directory, "somelib", "__init__.py")), directory
    assert not mt.locks.in_library(os.path.join(ROOT, "tests", "a_users_program.py"))


def test_every_internal_the_recorder_hooks_is_in_this_python():
    # run on each Python the suite runs on (tests/pythons/run): a Python that renames one fails
    from mpviz.trace import internals
    assert internals.missing() == []


CHANGED_PYTHON = """
import warnings
from multiprocessing import forkserver
import mpviz.trace as mt
import mpviz.viz as viz
del forkserver.ForkServer._stop        # as a Python that renamed it would be
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with mt.record() as trace:
        pass
print([str(w.message) for w in caught])
print(trace.notes)
print(viz.summary(trace))
"""


def test_a_python_without_an_internal_the_recorder_hooks_says_what_is_not_recorded():
    run = subprocess.run([sys.executable, "-c", CHANGED_PYTHON], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr
    warned, notes, summary = run.stdout.split("\n", 2)
    line = ("children of a fork server started before recording (mpviz hooks "
            "multiprocessing.forkserver.ForkServer._stop, which this Python "
            f"{'.'.join(map(str, sys.version_info[:3]))} does not have)")
    assert warned == repr([f"mpviz.trace: NOT RECORDED: {line}"])
    assert notes == repr([line])
    assert f"NOT RECORDED: {line}" in summary


MISSING_HOOK_TARGET = """
import warnings
from multiprocessing import heap, queues, spawn, util
import mpviz.trace as mt
del {target}                           # as a Python that renamed it would be
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with mt.record() as trace:
        pass
print(repr(trace.notes))
"""


@pytest.mark.parametrize("target, named", [
    ("spawn.prepare", "multiprocessing.spawn.get_preparation_data and prepare"),
    ("util.spawnv_passfds", "multiprocessing.util.spawnv_passfds"),
    ("queues.Queue._start_thread", "multiprocessing.queues.Queue._start_thread"),
    ("heap.Arena", "multiprocessing.heap.Arena")])
def test_a_missing_internal_that_a_hook_patches_is_said_once_by_its_name(target, named):
    """An internal both checked (internals.py) and patched (hooks.py): one NOT RECORDED line,
    that names it -- not a second line for the skipped patch, nor a module's repr."""
    run = subprocess.run([sys.executable, "-c", MISSING_HOOK_TARGET.format(target=target)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert run.returncode == 0, run.stderr
    notes = eval(run.stdout)
    assert len(notes) == 1, notes
    assert named in notes[0] and "<module" not in notes[0], notes


def test_pipes_are_linked():
    ctx = mp.get_context("spawn")
    with mt.record() as trace:
        a, b = ctx.Pipe()
        child = ctx.Process(target=w.echo, args=(b, 2))
        child.start()
        for i in range(2):
            a.send(w.Payload(i))
            assert a.poll(30)
            assert a.recv() == w.Payload(i)
        child.join()
        a.close()
        b.close()
    flows = [f for f in trace.flows() if f.put.kind == "pipe.send"]
    assert len(flows) == 4 and all(f.get is not None for f in flows)
    assert {(f.put.pid, f.get.pid) for f in flows} == {(os.getpid(), child.pid),
                                                       (child.pid, os.getpid())}


def test_nothing_is_patched_outside_record():
    originals = (queues.Queue.put, queues.SimpleQueue.put, connection._ConnectionBase.send,
                 mp.process.BaseProcess.start)
    with mt.record():
        assert queues.Queue.put is not originals[0]
    assert (queues.Queue.put, queues.SimpleQueue.put, connection._ConnectionBase.send,
            mp.process.BaseProcess.start) == originals
    assert recorder.ENABLED is False
    q = mp.get_context("fork").SimpleQueue()
    q.put(w.Payload(1))
    assert q.get() == w.Payload(1)
    q.close()


def test_live_reading_while_the_child_runs(ctx):
    with mt.record() as trace:
        ready, go = ctx.Event(), ctx.Event()
        p = ctx.Process(target=w.marks_then_wait, args=(100, ready, go))
        p.start()
        assert ready.wait(30)
        try:
            trace.refresh()
            ticks = [e for e in trace.of_kind("mark") if e.pid == p.pid]
            assert [e.args["i"] for e in ticks] == list(range(100))
            deadline = time.monotonic() + 30     # its last event: it starts waiting for `go`
            while not [e for e in trace.of_kind("wait.begin") if e.pid == p.pid]:
                assert time.monotonic() < deadline, "the child's wait for go was not recorded"
                time.sleep(0.01)
                trace.refresh()
            assert trace.refresh() == 0                  # nothing new: the child is waiting
        finally:
            go.set()                             # (also when an assert failed: no hang)
            p.join()
    assert [e.kind for e in trace.events if e.pid == p.pid][-1] == "process.exit"


def test_os_view_sees_segments_and_fds():
    from multiprocessing import shared_memory
    seg = shared_memory.SharedMemory(create=True, size=4096,
                                     name=f"mpviz_test_{uuid.uuid4().hex[:8]}")
    try:
        mapped = mt.os_view(os.getpid())
        seg.close()                                     # unmaps it and closes its fd
        closed = mt.os_view()
        assert seg.name in mapped.shm and seg.name not in closed.shm
        assert closed.nfds < mapped.nfds                  # its fd (and the fd mmap dup()ed)
    finally:
        seg.close()
        seg.unlink()
    with pytest.raises(ProcessLookupError):
        mt.os_view(2 ** 22 + 12345)


def test_a_record_blocks_watchdog_that_raises_is_said_and_the_block_goes_on(tmp_path):
    # a bug in the watchdog once ended its thread with Python's bare "Exception in thread
    # mpviz-hang-watchdog": the block went on unwatched, and nothing said why
    code = (
        "import time, mpviz.trace as mt, mpviz.trace.watchdog as w\n"
        "def poll(self):\n"
        "    raise RuntimeError('a bug in the watchdog, made for this test')\n"
        "w.Watchdog.poll = poll\n"
        f"with mt.record({str(tmp_path / 't')!r}, hang_after=1):\n"
        "    time.sleep(0.5)\n"
        "print('after the block', flush=True)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "after the block" in run.stdout, run.stderr
    assert ("mpviz: the hang watchdog failed -- a bug in mpviz, not in your program") in \
        run.stderr, run.stderr
    assert "RuntimeError: a bug in the watchdog, made for this test" in run.stderr
    assert "Exception in thread" not in run.stderr, run.stderr


@pytest.mark.timeout(60)
def test_a_block_that_ends_while_its_stacks_are_taken_gets_no_hang_verdict(tmp_path):
    # As the launcher's test: the child blocks SIGUSR1, so the capture waits its whole 1.5 s,
    # and the child's 1.8 s sleep runs out meanwhile; the block ends by itself. Said before: a
    # HANG verdict, the child killed (or "stopped 0 process(es)"), for a block that ended well.
    code = (
        "import signal, time\n"
        "import mpviz.trace as mt\n"
        "import multiprocessing as mp\n"
        "def nap():\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
        "    time.sleep(1.8)\n"
        "if __name__ == '__main__':\n"
        f"    with mt.record({str(tmp_path / 't')!r}, hang_after=1):\n"
        "        p = mp.get_context('fork').Process(target=nap)\n"
        "        p.start()\n"
        "        p.join()\n"
        "    print('after the block', p.exitcode, flush=True)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "after the block 0" in run.stdout, run.stderr
    assert "HANG" not in run.stderr, run.stderr
    assert "mpviz: no hang: the record() block ended by itself while mpviz took the stacks" \
        in run.stderr, run.stderr
