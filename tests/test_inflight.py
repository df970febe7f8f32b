"""Nothing sent is lost, nothing failed is kept: handles in flight, failed puts, closed queues.

* A ``file_system`` handle in a queue that a live process can still read must arrive, however
  long after its sender exited or was killed (the shm manager keeps the name).
* Once the queue that carried undelivered handles is gone in every live process, their names
  go (within ~3 s), even while a long-lived process keeps the manager busy.
* A put that fails half-way gives back every count and fd offer it took.
* A Queue used after ``close()`` says which call and why.
* ``shm_manager.fate`` and the memory map tell "in flight" from "leaked"; the segment header's
  channel slots say which queues a segment's handles took.
"""
import gc
import os

import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.multiprocessing import queues
from mpviz.sharing import fd_passing, file_system

from conftest import open_fds, shm_entries

pytestmark = pytest.mark.timeout(120)


# -- a put that fails gives back what it took -----------------------------------------------------

def _failing_puts(q, n):
    """`n` puts of (a fresh tensor, a lambda): each shares the tensor, then fails on the lambda."""
    errors = set()
    for _ in range(n):
        t = mpviz.zeros(10)
        try:
            q.put((t, lambda: 0))
        except Exception as e:                    # noqa: BLE001 - the test looks at which
            errors.add(type(e).__name__)
        del t
    return errors


def test_a_failed_put_gives_back_every_count_and_fd_it_took(strategy):
    q = mp.get_context("fork").Queue()
    _failing_puts(q, 1)                           # the fd server and manager connection start
    gc.collect()
    names, fds, offers = set(shm_entries()), open_fds(), fd_passing.pending_offers()
    errors = _failing_puts(q, 200)
    gc.collect()
    # each put refused, as before (a lambda: PicklingError, or AttributeError for a local one)
    assert len(errors) == 1 and errors <= {"PicklingError", "AttributeError"}, errors
    assert sorted(set(shm_entries()) - names) == [], "names left in /dev/shm"
    assert len(open_fds() - fds) == 0, "descriptors left open"
    assert fd_passing.pending_offers() == offers == 0, "fd offers nobody will fetch"
    q.close()
    q.join_thread()


def test_a_failed_put_leaves_the_tensors_count_as_it_was(strategy):
    q = mp.get_context("fork").Queue()
    t = mpviz.arange(4.0).share_memory_()
    segment = t.untyped_storage()._segment
    with pytest.raises(Exception):
        q.put((t, lambda: 0))
    assert file_system.refcount(segment.name) == 1 if strategy == "file_system" else \
        segment.refcount() == 1                   # ours alone: the dead handle's is given back
    q.put(t)                                      # and the tensor still travels
    assert q.get(timeout=10).tolist() == [0.0, 1.0, 2.0, 3.0]
    q.close()
    q.join_thread()


# -- a Queue used after close() -----------------------------------------------------------------

@pytest.mark.parametrize("call, use", [
    ("put", lambda q: q.put(1)),
    ("put_nowait", lambda q: q.put_nowait(1)),
    ("get", lambda q: q.get()),
    ("get_nowait", lambda q: q.get_nowait()),
    ("empty", lambda q: q.empty()),
])
def test_a_queue_used_after_close_names_the_call_and_why(call, use):
    q = mp.get_context("fork").Queue()
    q.put_nowait(0)                               # (empty() can't know it is empty: see below)
    q.close()
    q.join_thread()
    with pytest.raises(queues.QueueClosedError, match=rf"Queue\.{call}\(\): .* is closed in this process: "
                       r"close\(\) .*Fix: ") as info:
        use(q)
    assert isinstance(info.value, ValueError) and info.value.call == call
    import pickle
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)


def test_a_closed_queue_says_is_closed_as_the_stdlibs_does():
    # CPython's own test (test_closed_queue_put_get_exceptions) and code written against the
    # stdlib match these words: mpviz's longer message keeps them
    for q in mp.Queue(), mp.JoinableQueue():
        q.close()
        with pytest.raises(ValueError, match="is closed"):
            q.put("foo")
        with pytest.raises(ValueError, match="is closed"):
            q.get()
        q.join_thread()


def test_empty_on_a_used_closed_queue_raises_an_oserror_saying_is_closed_as_the_stdlibs_does():
    # CPython 3.13's test_closed_queue_empty_exceptions: the stdlib's empty() polls the closed
    # reading end, whose error is OSError("handle is closed")
    for q in mp.Queue(), mp.JoinableQueue():
        q.put("foo")
        q.close()
        q.join_thread()
        with pytest.raises(OSError, match="is closed"):
            q.empty()


def test_empty_on_a_queue_closed_before_any_use_is_true_as_the_stdlibs():
    # CPython 3.13's test_closed_queue_empty_exceptions, first half: nothing can ever have been
    # put in a queue made here, never handed to another process and never put to here
    for q in mp.Queue(), mp.JoinableQueue():
        q.close()
        q.join_thread()
        assert q.empty() is True


def _put_one(q):
    q.put(1)


def _handed_over(how, q):
    """`q` handed to another process, which put one item in it: a child of `how`, or os.fork."""
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:                              # (the child: put, then leave at once)
            try:
                _put_one(q)
                q.close()
                q.join_thread()
            finally:
                os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        return
    p = mp.get_context(how).Process(target=_put_one, args=(q,))
    p.start()
    p.join(60)
    assert p.exitcode == 0, p.exitcode


@pytest.mark.parametrize("how", ["fork", "spawn", "os.fork"])
def test_empty_on_a_closed_queue_another_process_has_raises_rather_than_guess(how):
    # the stdlib would answer False (its reading end is open, the child's item in the pipe);
    # ours is closed, so True would be false: it says why it cannot answer
    ctx = mp.get_context("fork" if how == "os.fork" else how)
    for q in ctx.Queue(), ctx.JoinableQueue():
        _handed_over(how, q)
        q.close()
        q.join_thread()
        with pytest.raises(queues.QueueClosedEmptyError,
                           match=r"Queue\.empty\(\): .* is closed in this process: .*Fix: "):
            q.empty()


# -- handles in flight: scenarios, each in a fresh interpreter with its own manager ---------------
#
# The manager serves one user and one MPVIZ_SHM_TAG. A scenario runs in a new Python with a tag of
# its own, so that no other process (this test run's, another run's) is connected to its manager:
# the one in these scenarios only ever hears from the scenario's processes. Its main process
# shares nothing itself unless told to (``model``), so when the producer is gone, nobody is.

SCENARIO = """
import sys, json
sys.path.insert(0, {tests!r})
import test_inflight
print(json.dumps(test_inflight.{name}(*{args!r})), flush=True)
"""


def _run_scenario(name, *args, new_group=False):
    """Start scenario `name`(*args) in a fresh interpreter with a fresh shm tag (and, if
    `new_group`, in a process group of its own); return the Popen (its stdout gives one JSON
    line) and the tag."""
    import secrets
    import subprocess
    import sys
    tag = f"inflight{secrets.token_hex(4)}_"
    env = dict(os.environ, MPVIZ_SHM_TAG=tag, MPVIZ_SHM_MANAGER="1")
    code = SCENARIO.format(tests=os.path.dirname(os.path.abspath(__file__)), name=name, args=args)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=new_group), tag


def _results(runs, timeout=90):
    return [_result(_finish(proc, timeout)) for proc, tag in runs]


def _finish(proc, timeout=90):
    """Wait for a scenario's interpreter: (exit code, stdout, stderr). One still running after
    `timeout` s is killed, and its stderr says so: the test that reads its result fails with
    that, and the tests of the runs started beside it (late_runs) go on."""
    import subprocess
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n(the scenario's interpreter was still running after {timeout} s: killed)"
    return proc.returncode, stdout, stderr


def _result(finished):
    """The JSON line a finished scenario printed, or a failure with its stderr."""
    import json
    returncode, stdout, stderr = finished
    assert returncode == 0, f"scenario failed ({returncode}):\n{stderr[-3000:]}"
    return json.loads(stdout.strip().splitlines()[-1])


def _names(tag):
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("mpviz_" + tag))


def _wait_for(condition, seconds):
    """Poll `condition` (an OS fact) for up to `seconds`; return how long it took, or None."""
    import time
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if condition():
            return time.monotonic() - start
        time.sleep(0.02)
    return time.monotonic() - start if condition() else None


def put_then_end(q, how, n=1):
    """Share `n` tensors of sevens under file_system, put them, make sure the handles are in the
    pipe, then end: normally ("exit") or by SIGKILL ("kill")."""
    import signal
    mp.set_sharing_strategy("file_system")
    kept = [mpviz.full((1000,), 7.0) for _ in range(n)]
    for t in kept:
        q.put(t)
    q.close()
    if hasattr(q, "join_thread"):
        q.join_thread()                        # every handle is in the pipe now
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def get_and_check(q, out):
    """A fresh consumer: get one tensor; say whether it is intact, or what error came."""
    mp.set_sharing_strategy("file_system")
    try:
        t = q.get(timeout=30) if hasattr(q, "get_nowait") else q.get()   # SimpleQueue: no timeout
        out.put("intact" if t.tolist() == [7.0] * 1000 else "corrupted")
    except Exception as e:                         # noqa: BLE001 - reported to the test
        out.put(f"{type(e).__name__}: {e}")


# Every late_consumer run of this module: (how the producer ends, the delay, the queue's kind).
# Each scenario is its own interpreter with its own shm tag and manager, and most of each one's
# time is the delay under test, a sleep: the `late_runs` fixture starts them all at once and
# each test below looks at its own.
LIVE_QUEUE_DELAYS = (0.5, 1.5, 3.0, 10.0)
LATE_RUNS = [(how, delay, "Queue") for how in ("exit", "kill") for delay in LIVE_QUEUE_DELAYS] + \
            [(how, 3.0, "SimpleQueue") for how in ("exit", "kill")]


def _run_together(name, runs, beside=()):
    """Start scenario `name` once per argument tuple in `runs`, all at once, and each
    (other name, args) in `beside` with them; wait for all of them: {args: (exit code, stdout,
    stderr)}, {(other name, args): ...} for those beside. None of their processes is left
    afterwards."""
    started = {args: _run_scenario(name, *args)[0] for args in runs}
    started.update({(other, args): _run_scenario(other, *args)[0] for other, args in beside})
    return {args: _finish(proc) for args, proc in started.items()}


# Scenarios whose time is mostly a wait of their own (killed_before_the_manager_looked: 2 s),
# run beside the late_consumer runs rather than one after the other.
BESIDE_LATE_RUNS = [("killed_before_the_manager_looked", (kind,))
                    for kind in ("SimpleQueue", "Queue")]


@pytest.fixture(scope="module")
def late_runs():
    """{(how, delay, kind): (exit code, stdout, stderr)} of every run in LATE_RUNS, and
    {(name, args): ...} of those in BESIDE_LATE_RUNS."""
    return _run_together("late_consumer", LATE_RUNS, beside=BESIDE_LATE_RUNS)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_handle_on_a_channel_the_manager_cannot_see_is_kept_while_its_program_lives(how,
                                                                                     late_runs):
    # A SimpleQueue writes its pipe itself (no mpviz put): the segment's header says "a channel
    # mpviz cannot name", and the manager keeps the name while its sender's process group lives.
    r = _result(late_runs[how, 3.0, "SimpleQueue"])
    assert r["result"] == "intact" and r["gone_after"] is not None, r


def _manager_pid(tag):
    """The pid of the shm manager serving `tag` (its environment names the tag), or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"--serve" not in argv or not any(a.endswith(b"shm_manager.py") for a in argv):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"MPVIZ_SHM_TAG={tag}".encode() in f.read().split(b"\0"):
                    return int(pid)
        except OSError:
            continue
    return None


def killed_before_the_manager_looked(kind):
    """The manager is paused (SIGSTOP) while a producer connects to it, puts a tensor on a
    `kind` queue and is SIGKILLed; then it goes on. It never saw the producer alive, so it cannot
    read its process group in /proc: the client says it in its first line. A fresh consumer, 2 s
    later, must still get the tensor."""
    import signal
    import time
    ctx = mp.get_context("spawn")
    tag = os.environ["MPVIZ_SHM_TAG"]
    mp.set_sharing_strategy("file_system")
    mpviz.zeros(1).share_memory_()               # starts the manager (the name goes at once)
    manager = _manager_pid(tag)
    q = getattr(ctx, kind)()
    os.kill(manager, signal.SIGSTOP)
    try:
        p = ctx.Process(target=put_then_end, args=(q, "kill"))
        p.start()
        p.join(60)
    finally:
        os.kill(manager, signal.SIGCONT)
    time.sleep(2.0)                              # > CHECK_SECONDS: the manager has judged it
    result = _fresh_get(ctx, q)
    gone = _wait_for(lambda: not _names(tag), 5)
    return {"exitcode": p.exitcode, "result": result, "gone_after": gone}


@pytest.mark.parametrize("kind", ["SimpleQueue", "Queue"])
def test_a_sender_killed_before_the_manager_saw_it_alive_still_delivers(kind, late_runs):
    r = _result(late_runs["killed_before_the_manager_looked", (kind,)])
    assert r["exitcode"] == -9 and r["result"] == "intact", r
    assert r["gone_after"] is not None, r


def pickle_a_handle_and_exit():
    """Make a handle by a channel mpviz cannot see (ForkingPickler.dumps), deliver it nowhere, and
    exit: the count it added stays in the header."""
    from multiprocessing.reduction import ForkingPickler
    mp.set_sharing_strategy("file_system")
    t = mpviz.full((1000,), 7.0)
    ForkingPickler.dumps(t)
    return {"name": t.untyped_storage().segment_name}


def test_a_handle_on_an_unseen_channel_goes_once_its_program_has_ended():
    # The program (a process group of its own) made a handle and exited: nobody of it is left
    # to receive one by whatever channel it took, so the manager removes the name.
    proc, tag = _run_scenario("pickle_a_handle_and_exit", new_group=True)
    (r,) = _results([(proc, tag)])
    took = _wait_for(lambda: not _names(tag), 6)
    assert took is not None and took <= 4.0, f"{r['name']} still in /dev/shm after 6 s"


def _fresh_get(ctx, q):
    out = ctx.SimpleQueue()
    c = ctx.Process(target=get_and_check, args=(q, out))
    c.start()
    result = out.get()
    c.join(30)
    out.close()
    return result


def late_consumer(how, delay, kind="Queue"):
    """A producer puts a tensor and ends; `delay` s later a fresh consumer gets it. `kind`:
    an mpviz Queue (the manager sees its pipe), or a SimpleQueue (a channel it cannot name)."""
    import time
    ctx = mp.get_context("spawn")
    q = getattr(ctx, kind)()
    p = ctx.Process(target=put_then_end, args=(q, how))
    p.start()
    p.join(60)
    ended = time.monotonic()
    tag = os.environ["MPVIZ_SHM_TAG"]
    in_shm = len(_names(tag))
    time.sleep(max(0.0, delay - (time.monotonic() - ended)))   # the time under test
    result = _fresh_get(ctx, q)
    gone = _wait_for(lambda: not _names(tag), 5)               # the consumer let go: no name left
    return {"exitcode": p.exitcode, "in_shm": in_shm, "result": result, "gone_after": gone}


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_handle_in_a_live_queue_arrives_however_late_its_sender_ended(how, late_runs):
    for delay in LIVE_QUEUE_DELAYS:
        r = _result(late_runs[how, delay, "Queue"])
        assert r["exitcode"] == (-9 if how == "kill" else 0), r
        assert r["in_shm"] == 1, r
        assert r["result"] == "intact", f"got {delay} s after the producer's {how}: {r}"
        assert r["gone_after"] is not None, f"the name outlived its consumer: {r}"


def storm_then_drop_queue(how_gone, rounds=8, per_round=3):
    """A long-lived main holds a model (so the manager always has a client); `rounds` producers
    each put `per_round` tensors and are SIGKILLed. While the queue is open the names stay (and
    a fresh consumer gets one intact); once the queue is gone here ("close": closed, the object
    kept; "collect": the last reference dropped), nobody alive can read it: measure how long
    the names take to go."""
    import time
    ctx = mp.get_context("fork")
    mp.set_sharing_strategy("file_system")
    model = mpviz.ones(1000).share_memory_()     # held all along, by a live process
    tag = os.environ["MPVIZ_SHM_TAG"]
    q = ctx.Queue()
    for _ in range(rounds):
        p = ctx.Process(target=put_then_end, args=(q, "kill", per_round))
        p.start()
        p.join(60)
        assert p.exitcode == -9, p.exitcode
    undelivered = len(_names(tag)) - 1
    time.sleep(2.5)                              # the time under test: the queue is still readable
    after_wait = len(_names(tag)) - 1
    late = _fresh_get(ctx, q)                    # and a late consumer still gets one; the
    _wait_for(lambda: len(_names(tag)) - 1 == undelivered - 1, 5)   # manager then removes it
    left = len(_names(tag)) - 1                  # (its last count was the dead producer's)
    if how_gone == "close":
        q.close()                                # (we keep the object: closed is enough)
        q.join_thread()
    else:
        del q
        gc.collect()
    gone = _wait_for(lambda: len(_names(tag)) == 1, 10)
    model_kept = _names(tag) == [model.untyped_storage().segment_name.lstrip("/")]
    return {"undelivered": undelivered, "after_wait": after_wait, "late": late, "left": left,
            "gone_after": gone, "model_kept": model_kept}


@pytest.fixture(scope="module")
def storm_runs():
    """Both storm_then_drop_queue runs (each waits 2.5 s on purpose), side by side."""
    return _run_together("storm_then_drop_queue", [("close",), ("collect",)])


@pytest.mark.parametrize("how_gone", ["close", "collect"])
def test_undelivered_names_go_once_their_queue_is_gone_everywhere(how_gone, storm_runs):
    r = _result(storm_runs[how_gone,])
    assert r["undelivered"] == 24 and r["after_wait"] == 24, r   # readable: all kept
    assert r["late"] == "intact" and r["left"] == 23, r
    assert r["gone_after"] is not None and r["gone_after"] <= 3.0, \
        f"undelivered names stayed after their queue was gone: {r}"
    assert r["model_kept"], r


def fate_as_the_queue_goes(manager):
    """What fate() says of a handle in a queue we can read, then once we closed the queue, with
    the manager on (it is asked) or off (fate looks at /proc and the header itself)."""
    from mpviz.sharing import shm_manager
    shm_manager.enable(manager)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=put_then_end, args=(q, "kill"))
    p.start()
    p.join(60)
    (name,) = _names(os.environ["MPVIZ_SHM_TAG"])
    readable = shm_manager.fate("/" + name)
    import subprocess
    import sys
    cli = subprocess.run([sys.executable, "-m", "mpviz", "shm"], capture_output=True, text=True,
                         timeout=60).stdout       # what `python -m mpviz shm` tells the learner
    q.close()
    closed = shm_manager.fate("/" + name)
    if manager:
        _wait_for(lambda: not _names(os.environ["MPVIZ_SHM_TAG"]), 5)
    else:
        os.unlink("/dev/shm/" + name)             # nobody else will: the manager is off
    return {"readable": readable, "closed": closed, "gone": shm_manager.fate("/" + name),
            "me": os.getpid(), "cli": cli, "name": name}


@pytest.fixture(scope="module")
def fate_runs():
    """Both fate_as_the_queue_goes runs (manager on, off), side by side."""
    return _run_together("fate_as_the_queue_goes", [(True,), (False,)])


@pytest.mark.parametrize("manager", [True, False], ids=["manager-on", "manager-off"])
def test_fate_tells_a_handle_in_a_readable_queue_from_one_nobody_can_receive(manager, fate_runs):
    r = _result(fate_runs[manager,])
    readable, closed = r["readable"], r["closed"]
    line = next(x for x in r["cli"].splitlines() if r["name"] in x)   # python -m mpviz shm
    assert line.endswith(f"{readable[0].upper()}: {readable[1]}"), r["cli"]
    if manager:
        assert readable[0] == "in flight" and f"pid {r['me']} can still get them" in readable[1], r
        assert closed[0] in ("unreachable", "gone"), r     # the manager may be quicker than us
    else:
        assert readable[0] == "maybe in flight" and f"pid {r['me']} can still read" in readable[1], r
        assert closed[0] == "leaked" and "none can receive" in closed[1], r
    assert r["gone"][0] == "gone", r


# -- the memory map: in flight is not leaked ------------------------------------------------------

def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_the_memory_map_draws_a_handle_in_a_queue_as_in_flight_not_leaked():
    import mpviz.trace as mt
    from mpviz import viz
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        with mt.record() as trace:
            p = ctx.Process(target=put_then_end, args=(q, "kill"), name="producer")
            p.start()
            p.join(60)
        assert p.exitcode == -9
        plain = viz.memory_map(trace)                 # the trace alone: it may be in flight
        words = _texts(plain)
        assert "LEAKED" not in words and any(w.startswith("in flight?") for w in words), words
        assert "maybe in flight" in plain.axes[0].get_title(loc="left")
        checked = viz.memory_map(trace, check_os=True)    # the manager says: we can get it
        assert f"in flight in a queue\n(pid {os.getpid()} can get it)" in _texts(checked)
        assert q.get(timeout=30).tolist() == [7.0] * 1000  # and it does arrive
    finally:
        mp.set_sharing_strategy(old)
    q.close()
    q.join_thread()


# -- the channels in a segment's header ------------------------------------------------------------

def test_the_header_names_each_queue_once_and_says_when_a_channel_is_unknown():
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("fork")
    queues_ = [ctx.Queue() for _ in range(file_system.SLOTS + 1)]
    try:
        t = mpviz.zeros(4).share_memory_()
        segment = t.untyped_storage()._segment
        channels = lambda: file_system.channels(bytes(segment._buf[:file_system.HEADER]))  # noqa
        for q in queues_[:2]:
            q.put(t)
            q.put(t)                              # the same queue again: nothing new written
        assert channels() == ({q._channel for q in queues_[:2]}, False)
        for q in queues_[2:]:
            q.put(t)                              # one channel more than there are slots
        pipes, unknown = channels()
        assert len(pipes) == file_system.SLOTS and unknown
        for q in queues_:
            while not q.empty():
                q.get(timeout=10)
    finally:
        mp.set_sharing_strategy(old)
        for q in queues_:
            q.close()
            q.join_thread()


def test_a_segment_the_cache_hands_out_again_forgets_its_old_channels():
    from mpviz.sharing import allocator
    old, budget = mp.get_sharing_strategy(), allocator.stats()["budget"]
    mp.set_sharing_strategy("file_system")
    allocator.enable(1 << 20)
    q = mp.get_context("fork").Queue()
    try:
        t = mpviz.zeros(64).share_memory_()
        name = t.untyped_storage().segment_name
        q.put(t)
        del t
        q.get(timeout=10)                          # received here: the handle's count is back
        gc.collect()                               # ... and the segment parked
        again = mpviz.zeros(64).share_memory_()
        segment = again.untyped_storage()._segment
        assert segment.name == name                # the same segment, handed out again
        assert file_system.channels(bytes(segment._buf[:file_system.HEADER])) == (set(), False)
        del again, segment
    finally:
        allocator.enable(budget)
        mp.set_sharing_strategy(old)
        q.close()
        q.join_thread()


# -- a holder killed while it gives its count back ------------------------------------------------

def _arrives_then_goes(q, name):
    """The tensor of sevens comes out of `q` intact; once we let it go, its name goes."""
    from mpviz.sharing import shm_manager
    got = q.get(timeout=30)
    assert got.tolist() == [7.0] * 1000
    del got
    gc.collect()
    assert _wait_for(lambda: not os.path.exists("/dev/shm" + name), 10) is not None, \
        shm_manager.fate(name)


def give_back_and_die(inbox, when):
    """A holder of the tensor it gets from `inbox`, killed by SIGKILL while it gives its count
    back: after the manager heard "LETGO" and before the count went ("before"), or after the
    count went and before the manager heard the new number ("after"). Where a terminate()'s
    SIGTERM landed 1 run in ~5 of a Pool round trip (docs/INTERNALS.md)."""
    import signal
    t = inbox.get(timeout=60)
    hold = t.untyped_storage()._segment._hold
    hold.counting_out()
    if when == "after":
        hold.give_back()
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_holder_killed_while_giving_its_count_back_neither_leaks_nor_loses_a_handle(when):
    # Before: killed between its line and its give-back ("before"), the holder left a count the
    # manager took for a handle in flight, and the name stayed while the program's process group
    # lived (a notebook kernel's whole life). The other order ("after") must not cost a handle
    # still in flight: here one is in a queue this process can read when the holder dies.
    from mpviz.sharing import shm_manager
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        ctx = mp.get_context("fork")
        inbox, q = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=give_back_and_die, args=(inbox, when))
        p.start()                                  # (before the tensor: it receives it)
        t = mpviz.full((1000,), 7.0).share_memory_()
        name = t.untyped_storage()._segment.name
        inbox.put(t)
        p.join(60)
        assert p.exitcode == -9
        q.put(t)
        del t
        gc.collect()
        # nobody alive maps it now; one handle is in the queue: kept, and it arrives intact
        assert _wait_for(lambda: shm_manager.fate(name)[0] != "held", 10) is not None
        assert shm_manager.fate(name)[0] == "in flight", shm_manager.fate(name)
        _arrives_then_goes(q, name)   # (the manager settles the killed one's count)
    finally:
        mp.set_sharing_strategy(old)
    for queue in (inbox, q):
        queue.close()
        queue.join_thread()


def keep_then_send(t, go, q):
    """A forked child that keeps `t` (its parent's, inherited) until `go`, then sends it back."""
    go.wait(60)
    q.put(t)
    q.close()
    q.join_thread()


def test_a_forked_child_still_holding_a_tensor_its_parent_dropped_keeps_its_name():
    # Before: the child's at-fork count reached the manager on a connection that the next
    # at-fork hook closed at once -- the manager took the child for dead, and when the parent
    # let go it removed the name the child still mapped: the child's put of it then reached
    # nobody (its receiver: "no such file").
    from mpviz.sharing import shm_manager
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        ctx = mp.get_context("fork")
        q, go = ctx.Queue(), ctx.Event()
        t = mpviz.full((1000,), 7.0).share_memory_()
        name = t.untyped_storage()._segment.name
        p = ctx.Process(target=keep_then_send, args=(t, go, q))
        p.start()
        del t
        gc.collect()
        assert _wait_for(lambda: shm_manager.fate(name) == ("held", f"mapped by pid {p.pid}"),
                         10) is not None, shm_manager.fate(name)
        go.set()
        _arrives_then_goes(q, name)
        p.join(60)
    finally:
        mp.set_sharing_strategy(old)
    q.close()
    q.join_thread()
