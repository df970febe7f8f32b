"""Bad input gets what, why and how to fix (issue 28's "still vague" cases, and item 9): each
test runs the real call -- a real queue, pipe, process, environment or command line -- and
reads the message a learner would see. The stdlib's own words stay inside ours.
"""
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import mpviz
import mpviz.multiprocessing as mp

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mpviz.__file__)))


@contextlib.contextmanager
def _queue():
    """A real Queue, closed and its feeder joined afterwards, whatever the test raised."""
    q = mp.Queue()
    try:
        yield q
    finally:
        q.close()
        q.join_thread()


@contextlib.contextmanager
def _pipe():
    a, b = mp.Pipe()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def test_queue_put_of_a_lambda_says_what_it_is_and_to_define_a_function():
    with _queue() as q:
        with pytest.raises(Exception, match=r"Can't pickle .*lambda.*put\(obj\) pickles the "
                                            r"object.*a lambda.*Fix: define the function"):
            q.put(lambda: 0)
        q.put("still works")
        assert q.get(timeout=5) == "still works"


def test_queue_put_of_an_open_file_says_to_send_its_path():
    with _queue() as q:
        with open(__file__) as f:
            with pytest.raises(TypeError) as pickle_says:       # (3.13 words it apart from 3.11)
                pickle.dumps(f)
            with pytest.raises(TypeError, match=r"cannot pickle '(_io.)?TextIOWrapper' "
                                                r"(object|instances): "
                                                r"put\(obj\).*an open file.*Fix: send the "
                                                r"file's path") as put_says:
                q.put(f)
            assert str(put_says.value).startswith(str(pickle_says.value) + ": put(obj)")


def test_pipe_send_of_a_lambda_says_what_it_is_and_the_pipe_stays_usable():
    with _pipe() as (a, b):
        with pytest.raises(Exception, match=r"Can't pickle .*lambda.*send\(obj\) pickles the "
                                            r"object.*Nothing was sent"):
            a.send(lambda: 0)
        a.send("hello")
        assert b.recv() == "hello"


def test_queue_put_of_a_multiprocessing_lock_says_to_pass_it_when_the_child_starts():
    with _queue() as q:
        with pytest.raises(RuntimeError, match=r"Lock objects should only be shared between "
                                               r"processes through inheritance: put\(obj\).*"
                                               r"Nothing was sent. Fix: pass it to the child "
                                               r"when it starts"):
            q.put(mp.Lock())


def test_pipe_send_of_an_event_says_to_pass_it_when_the_child_starts():
    with _pipe() as (a, b):
        with pytest.raises(RuntimeError, match=r"should only be shared between processes "
                                               r"through inheritance: send\(obj\).*Fix: pass "
                                               r"it to the child when it starts"):
            a.send(mp.Event())


def test_put_of_an_object_of_no_known_kind_says_it_once():
    with _queue() as q:
        with pytest.raises(TypeError) as caught:
            q.put(memoryview(b"x"))
        said = str(caught.value)
        assert said.startswith("cannot pickle memoryview objects: put(obj) pickles")
        assert said.count("cannot carry") == 1, said
        assert "Fix: send plain data" in said


def _echo(conn):
    conn.send(conn.recv())


def test_a_pipe_end_given_to_a_child_still_travels(ctx):
    a, b = ctx.Pipe()
    p = ctx.Process(target=_echo, args=(b,))
    p.start()
    a.send([1, 2])
    assert a.recv() == [1, 2]
    p.join(10)
    a.close()
    b.close()
    assert p.exitcode == 0


def test_zeros_too_big_to_exist_names_the_sizes_and_the_fix():
    with pytest.raises(ValueError, match=r"mpviz.zeros\(1099511627776, 1099511627776\): "
                                         r".* elements of float32 .*more than any array can "
                                         r"span .*array is too big.*Fix: check the sizes"):
        mpviz.zeros(2**40, 2**40)


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=ROOT, **env))


@pytest.mark.parametrize("value, why", [("two", "is not a whole number"),
                                        ("0", "would leave the simulator with no device")])
def test_a_bad_mpviz_sim_devices_is_named_with_the_fix(value, why):
    out = _python("import mpviz; mpviz.ones(2).cuda()", MPVIZ_SIM_DEVICES=value,
                  MPVIZ_CUDA_BACKEND="simulator")
    assert out.returncode != 0
    assert f"MPVIZ_SIM_DEVICES={value!r} {why}" in out.stderr, out.stderr[-800:]
    assert "Fix: MPVIZ_SIM_DEVICES=2" in out.stderr


def test_a_bad_mpviz_step_socket_says_to_unset_it():
    out = _python("from mpviz.stepper import gate; gate.activate()",
                  MPVIZ_STEP_SOCKET="/nonexistent/mpviz.sock")
    assert out.returncode != 0
    assert ("MPVIZ_STEP_SOCKET='/nonexistent/mpviz.sock': no stepper listens there"
            in out.stderr), out.stderr[-800:]
    assert "Fix: unset MPVIZ_STEP_SOCKET" in out.stderr


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mpviz", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))


def test_numel_written_as_1e3_is_a_thousand_and_a_fraction_is_refused_clearly():
    out = _cli("run", "queue-sharing", "--numel", "1.5")
    assert out.returncode == 2
    assert "numel must be a whole number (a count), not '1.5'. Fix: --numel 2" in out.stderr
    out = _cli("run", "queue-sharing", "--numel", "1e3")
    assert out.returncode == 0, out.stderr[-800:]
    assert "numel=1000" in out.stdout



def test_numel_inf_or_nan_is_refused_as_not_finite_on_the_command_line_and_in_python():
    for text in ("inf", "nan"):
        out = _cli("run", "queue-sharing", "--numel", text)
        assert out.returncode == 2, out.stderr[-800:]
        assert "Traceback" not in out.stderr, out.stderr[-800:]
        assert (f"numel must be a finite number, not {float(text)!r}. Fix: --numel 65536 "
                f"(its default)") in out.stderr, out.stderr
    import mpviz.scenarios as sc
    with pytest.raises(ValueError, match=r"numel must be a finite number, not nan"):
        sc.run("queue-sharing", numel=float("nan"))

def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_run(tmp_path):
    started = time.monotonic()
    out = _cli("run", "fork-held-lock", "--plot", str(tmp_path / "x.xyz"))
    assert out.returncode == 2
    assert "'xyz' is not a picture format matplotlib can write" in out.stderr
    assert "refused before the run" in out.stderr and "Fix: --plot" in out.stderr
    assert "DEADLOCK" not in out.stdout and out.stdout == ""      # nothing ran
    assert time.monotonic() - started < 30


# --- item 9: Event.set() after a waiter was killed inside Event.wait() ------------------------

def _wait_for(ev):
    ev.wait()


def test_event_set_returns_after_a_waiter_was_killed_inside_wait_and_names_it(ctx):
    ev = ctx.Event()
    waiter = ctx.Process(target=_wait_for, args=(ev,), name="waiter")
    waiter.start()
    deadline = time.monotonic() + 30
    while ev._cond._sleeping_count.get_value() < 1:        # asleep in wait()
        assert time.monotonic() < deadline, "the waiter never went to sleep"
        time.sleep(0.01)
    os.kill(waiter.pid, signal.SIGKILL)
    waiter.join()
    caught = []

    def set_it():
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ev.set()
        caught.extend(seen)
    setter = threading.Thread(target=set_it, daemon=True)
    setter.start()
    setter.join(10)
    assert not setter.is_alive(), "Event.set() hangs after a waiter was killed in wait()"
    assert ev.is_set()
    assert any(f"process {waiter.pid} was waiting in Event.wait() and died" in str(w.message)
               for w in caught), [str(w.message) for w in caught]
    # and the Event still works for a live waiter
    ev.clear()
    again = ctx.Process(target=_wait_for, args=(ev,))
    again.start()
    while ev._cond._sleeping_count.get_value() < 1:
        time.sleep(0.01)
    ev.set()
    again.join(10)
    assert again.exitcode == 0



def test_an_event_of_a_fork_context_holds_no_file_descriptor_as_the_stdlibs_holds_none():
    """(Each once held two -- its slots' memfd and the mmap's copy of it -- in every process
    that had it: 512 Events filled a 1,024-fd limit, and a forked child inherited them all.)"""
    ctx = mp.get_context("fork")
    before = len(os.listdir("/proc/self/fd"))
    events = [ctx.Event() for _ in range(50)]
    assert len(os.listdir("/proc/self/fd")) - before == 0
    waiter = ctx.Process(target=_wait_for, args=(events[-1],))    # and it works across fork
    waiter.start()
    deadline = time.monotonic() + 30
    while events[-1]._cond._sleeping_count.get_value() < 1:
        assert time.monotonic() < deadline, "the waiter never went to sleep"
        time.sleep(0.01)
    events[-1].set()
    waiter.join(10)
    assert waiter.exitcode == 0


def _forty_threads_wait_for(ev):
    threads = [threading.Thread(target=ev.wait) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_event_set_returns_after_a_process_with_forty_waiting_threads_was_killed():
    """More sleepers than the Event once had slots for (32): the ones without a slot, killed,
    made set() wait for ever, as the stdlib's."""
    ev = mp.get_context("fork").Event()
    waiter = mp.get_context("fork").Process(target=_forty_threads_wait_for, args=(ev,))
    waiter.start()
    deadline = time.monotonic() + 30
    while ev._cond._sleeping_count.get_value() < 40:
        assert time.monotonic() < deadline, "the 40 threads never went to sleep"
        time.sleep(0.01)
    os.kill(waiter.pid, signal.SIGKILL)
    waiter.join()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setter = threading.Thread(target=ev.set, daemon=True)
        setter.start()
        setter.join(10)
    assert not setter.is_alive(), "Event.set() hangs after 40 waiters were killed in wait()"
    assert ev.is_set()
    assert any(f"process {waiter.pid} was waiting" in str(w.message) for w in caught)

def _hold_the_events_lock(ev, held):
    ev._cond.__enter__()         # inside one of the Event's methods, the instant it is killed
    held.set()
    time.sleep(60)


def test_event_whose_lock_died_with_its_holder_raises_naming_the_pid(ctx):
    from mpviz.multiprocessing.synchronize import BrokenEventError
    ev, held = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_the_events_lock, args=(ev, held))
    holder.start()
    assert held.wait(30)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    with pytest.raises(BrokenEventError, match=rf"held by process {holder.pid}, which has died.*"
                                               rf"Fix: make a new Event"):
        ev.set()



def _hold_then_let_go(ev, held, go, seconds):
    ev._cond.__enter__()
    held.set()
    go.wait()
    time.sleep(seconds)
    ev._cond.__exit__()


def test_a_lock_holder_that_let_go_and_exited_while_another_looked_is_not_called_dead():
    """A process kept waiting for the Event's lock looks at its holder (pid, then start time);
    if in between the holder lets go and exits, and another takes the lock, the Event is not
    broken. (The reads are paused after the pid to make that instant happen every time.)"""
    from mpviz.multiprocessing.synchronize import BrokenEventError
    ctx = mp.get_context("fork")
    ev = ctx.Event()
    held1, go1, held2, go2 = (ctx.Event() for _ in range(4))
    first = ctx.Process(target=_hold_then_let_go, args=(ev, held1, go1, 0))
    first.start()
    assert held1.wait(30)
    second = ctx.Process(target=_hold_then_let_go, args=(ev, held2, go2, 0.3))
    slots = ev._cond._slots

    class PausedAfterThePid:
        def __getitem__(self, i):
            value = slots[i]
            if i == 0 and value == first.pid and not second.pid:
                second.start()                     # the first lets go and exits; the second
                go1.set()                          # takes the lock; then the look goes on
                assert held2.wait(30)
                first.join(30)
                go2.set()
            return value

        def __setitem__(self, i, value):
            slots[i] = value

    ev._cond._slots = PausedAfterThePid()
    try:
        assert ev.is_set() is False                # waits for the second to let go
    except BrokenEventError as exc:
        pytest.fail(f"a false BrokenEventError: {exc}")
    finally:
        ev._cond._slots = slots
        go1.set()
        go2.set()
        first.join(30)
        if second.pid:
            second.join(30)
    assert second.pid and first.exitcode == 0 and second.exitcode == 0

def test_an_events_own_memory_is_not_drawn_as_the_programs_shared_memory(ctx):
    """The Event keeps its sleepers' slots in a memfd of its own, not in the stdlib heap where
    Value/Array live: a program that shares only an Event shows 0 segments and 0 handles, as
    torch's would (it once showed a /pym-* arena, 'mapped by 2 processes', and a handle)."""
    import mpviz.trace as mt
    with mt.record() as trace:
        ev = ctx.Event()
        child = ctx.Process(target=_wait_for, args=(ev,))
        child.start()
        ev.set()
        child.join(30)
    assert child.exitcode == 0
    assert trace.segments() == []
    assert sum(f.put.args.get("handles", 0) for f in trace.flows()) == 0
