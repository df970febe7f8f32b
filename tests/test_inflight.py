"""Nothing sent is lost, nothing failed is kept: handles in flight, failed puts, closed queues.

* A ``file_system`` handle in a queue that a live process can still read must arrive, however
  long after its sender exited or was killed (the shm manager keeps the name).
* Once the queue that carried undelivered handles is gone in every live process, their names
  go (within ~3 s), even while a long-lived process keeps the manager busy.
* A put that fails half-way gives back every count and fd offer it took.
* A Queue used after ``close()`` says which call and why.
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
    q.close()
    q.join_thread()
    with pytest.raises(queues.QueueClosedError, match=rf"Queue\.{call}\(\) on .* closed: "
                       r"close\(\) .*Fix: ") as info:
        use(q)
    assert isinstance(info.value, ValueError) and info.value.call == call
    import pickle
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)


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


def _run_scenario(name, *args, timeout=90):
    """Start scenario `name`(*args) in a fresh interpreter with a fresh shm tag; return the
    Popen (its stdout gives one JSON line) and the tag."""
    import secrets
    import subprocess
    import sys
    tag = f"inflight{secrets.token_hex(4)}_"
    env = dict(os.environ, MPVIZ_SHM_TAG=tag, MPVIZ_SHM_MANAGER="1")
    code = SCENARIO.format(tests=os.path.dirname(os.path.abspath(__file__)), name=name, args=args)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True), tag


def _results(runs, timeout=90):
    import json
    out = []
    for proc, tag in runs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"scenario failed ({proc.returncode}):\n{stderr[-3000:]}"
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


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
    q.join_thread()                            # every handle is in the pipe now
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


def get_and_check(q, out):
    """A fresh consumer: get one tensor; say whether it is intact, or what error came."""
    mp.set_sharing_strategy("file_system")
    try:
        t = q.get(timeout=30)
        out.put("intact" if t.tolist() == [7.0] * 1000 else "corrupted")
    except Exception as e:                         # noqa: BLE001 - reported to the test
        out.put(f"{type(e).__name__}: {e}")


def _fresh_get(ctx, q):
    out = ctx.SimpleQueue()
    c = ctx.Process(target=get_and_check, args=(q, out))
    c.start()
    result = out.get()
    c.join(30)
    out.close()
    return result


def late_consumer(how, delay):
    """A producer puts a tensor and ends; `delay` s later a fresh consumer gets it."""
    import time
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
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
def test_a_handle_in_a_live_queue_arrives_however_late_its_sender_ended(how):
    delays = (0.5, 1.5, 3.0, 10.0)
    results = _results([_run_scenario("late_consumer", how, d) for d in delays])
    for delay, r in zip(delays, results):
        assert r["exitcode"] == (-9 if how == "kill" else 0), r
        assert r["in_shm"] == 1, r
        assert r["result"] == "intact", f"got {delay} s after the producer's {how}: {r}"
        assert r["gone_after"] is not None, f"the name outlived its consumer: {r}"


def storm_then_drop_queue(how_gone, rounds=8, per_round=3):
    """A long-lived main holds a model (so the manager always has a client); `rounds` producers
    each put `per_round` tensors and are SIGKILLed. While the queue is open the names stay (and
    a fresh consumer gets one intact); once the queue is gone here ("close", or "collect": the
    last reference dropped), nobody alive can read it: measure how long the names take to go."""
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
    late = _fresh_get(ctx, q)                    # and a late consumer still gets one
    left = len(_names(tag)) - 1
    if how_gone == "close":
        q.close()
        q.join_thread()
    del q
    gc.collect()
    gone = _wait_for(lambda: len(_names(tag)) == 1, 10)
    model_kept = _names(tag) == [model.untyped_storage().segment_name.lstrip("/")]
    return {"undelivered": undelivered, "after_wait": after_wait, "late": late, "left": left,
            "gone_after": gone, "model_kept": model_kept}


@pytest.mark.parametrize("how_gone", ["close", "collect"])
def test_undelivered_names_go_once_their_queue_is_gone_everywhere(how_gone):
    (r,) = _results([_run_scenario("storm_then_drop_queue", how_gone)])
    assert r["undelivered"] == 24 and r["after_wait"] == 24, r   # readable: all kept
    assert r["late"] == "intact" and r["left"] == 23, r
    assert r["gone_after"] is not None and r["gone_after"] <= 3.0, \
        f"undelivered names stayed after their queue was gone: {r}"
    assert r["model_kept"], r
