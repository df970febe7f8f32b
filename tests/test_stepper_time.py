"""The stepper tells waiting for time from being stuck (issue 28, item 7): a thread in
``time.sleep`` (or a wait with a timeout), or one still computing, is offered as "let time
pass", never called a deadlock; a stall after a child died of an error is that error; a killed
child cannot be stepped; and a Stepper whose kernel was SIGKILLed leaves no /tmp/mpviz-step-*
behind once the next Stepper starts. Real stepped runs, real processes.
"""
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import mpviz
import mpviz.scenarios as sc
import stepper_workers as w
from mpviz.stepper import ChoiceError

pytestmark = pytest.mark.timeout(120)


def test_a_sleeping_main_thread_is_a_choice_to_let_time_pass_not_a_deadlock():
    with mpviz.step(w.sleeper, 2.5) as s:
        choices = s.choices()
        assert s.outcome is None, s.explanation
        assert [c.op for c in choices] == ["time"]
        assert choices[0].label.startswith("main/main: sleeping (time.sleep)")
        assert "let time pass" in choices[0].label
        assert s.run_until(lambda s: False) == "ok", s.explanation
        assert "main/main: sleeping" in s.history[0]



def test_a_wait_with_a_timeout_is_a_choice_to_let_time_pass_not_a_deadlock():
    # select() given a timeout: blocked in the OS, and nobody will write the pipe, yet time ends
    # the wait (the same reading of /proc/PID/task/TID/syscall as a lock's acquire(timeout=))
    with mpviz.step(w.waits_on_a_pipe_with_a_timeout, 2.0) as s:
        choices = s.choices()
        assert s.outcome is None, s.explanation
        assert [c.op for c in choices] == ["time"], choices
        assert choices[0].label.startswith("main/main: waiting with a timeout: it waits for time")
        assert s.run_until(lambda s: False) == "ok", s.explanation


def _until_paused_at_a_stop(s):
    """(the learner reads the choices a while; meanwhile time brings the run to a stop)"""
    deadline = time.monotonic() + 30
    while True:
        with s._cv:
            if s._waiting:
                return
        assert time.monotonic() < deadline, "the run never reached its stop"
        time.sleep(0.02)


def test_stepping_the_index_of_let_time_pass_after_time_moved_the_run_steps_nothing_unseen():
    with mpviz.step(w.naps_then_takes_a_lock, 2.0) as s:
        listed = s.choices()
        assert [c.op for c in listed] == ["time"], listed
        _until_paused_at_a_stop(s)
        after = s.step(0)                  # 0 was "let time pass": the acquire was never listed
        assert "main/main: acquire" not in " ".join(s.history), s.history
        assert [c.label for c in after] == ["main/main: acquire lock L (free)"], after


def test_undo_after_time_moved_the_run_replays_the_steps_taken_not_a_wait():
    with mpviz.step(w.naps_then_takes_a_lock, 2.0) as s:
        assert [c.op for c in s.choices()] == ["time"]
        _until_paused_at_a_stop(s)
        s.step(s.choices()[0])             # acquire lock L
        assert s.history == ["main/main: acquire lock L (free)"]
        s.step(0)                          # release it
        s.undo()
        assert s.history == ["main/main: acquire lock L (free)"], s.history
        assert [c.label for c in s.choices()] == ["main/main: release lock L"]


def test_letting_time_pass_lasts_until_the_sleeper_wakes_not_a_fixed_five_seconds():
    with mpviz.step(w.child_polls_an_event_nobody_sets, 0.3) as s:
        for _ in range(10):
            choices = s.choices()
            if choices and choices[0].op == "time" and choices[0].who == "child/main":
                break
            s.step(0)
        assert choices[0].label.startswith("child/main: sleeping"), choices
        for _ in range(2):                 # each a 0.3 s sleep, a look at the Event, a sleep
            started = time.monotonic()
            after = s.step(choices[0])
            took = time.monotonic() - started
            assert took < 4, f"letting time pass took {took:.1f} s for a 0.3 s sleep"
            assert [c.op for c in after] == ["time"], after
            choices = after


def test_all_schedules_does_not_branch_on_which_sleeper_time_moves():
    """Two children asleep at once are two "let time pass" choices, both the same wait: not
    two schedules (each such place doubled the runs, every one the same)."""
    from mpviz.stepper import all_schedules
    outcomes, examples = all_schedules(lambda: mpviz.step(w.two_children_sleep, 2.0), limit=4)
    assert outcomes == {"ok": 1}, (outcomes, examples)

def test_a_parent_blocked_in_get_while_its_child_sleeps_is_not_a_deadlock():
    with mpviz.step(w.parent_gets_while_child_sleeps, 2.0) as s:
        seen = []
        while s.choices():
            seen.append(s.choices()[0].label)
            s.step(0)
        assert s.outcome == "ok", (s.explanation, seen)
        assert any(label.startswith("child/") and "sleeping" in label for label in seen), seen


def test_a_child_dead_of_memory_error_is_the_outcome_not_a_deadlock():
    with mpviz.step(w.child_dies_of_memory_error) as s:
        assert s.run_until(lambda s: False) == "error"
        assert "Process child" in s.explanation and "exit code 1" in s.explanation
        assert "MemoryError" in s.explanation
        assert "not a deadlock" in s.explanation



def test_a_deadlock_after_an_unrelated_child_died_of_an_error_is_still_a_deadlock():
    with mpviz.step(w.helper_crashed_then_lock_order_deadlock) as s:
        assert s.run_until(lambda s: False) == "deadlock", s.explanation
        assert "Nobody will ever move again" in s.explanation
        assert "main/main" in s.explanation and "worker/main" in s.explanation
        assert "Process helper" in s.explanation and "ValueError: bad config" in s.explanation
        assert "not a deadlock" not in s.explanation


def test_joining_a_worker_while_holding_its_lock_after_an_unrelated_death_is_a_deadlock():
    with mpviz.step(w.helper_crashed_then_join_while_holding_the_lock) as s:
        assert s.run_until(lambda s: False) == "deadlock", s.explanation
        assert "Nobody will ever move again" in s.explanation
        assert "Process helper" in s.explanation and "ValueError: bad config" in s.explanation

def test_a_puzzle_refuses_an_item_its_child_cannot_allocate():
    with pytest.raises(ValueError, match=r"nbytes=1000000000000 is out of range.*Fix: nbytes "
                                         r"between 1 and 268,435,456"):
        sc.step("queue-feeder-hang", nbytes=10**12)


def test_choices_on_a_busy_function_come_back_soon_offering_to_wait():
    with mpviz.step(w.busy, 40.0) as s:
        started = time.monotonic()
        choices = s.choices()
        took = time.monotonic() - started
        assert took < 20, f"choices() took {took:.1f} s"     # (before: 20 s, then 20 s more)
        assert [c.op for c in choices] == ["time"], choices
        assert choices[0].label.startswith("main/main: running")
        assert s.outcome is None


def test_stepping_a_child_killed_from_outside_says_it_was_killed():
    with sc.step("lock-order") as s:
        s.step("main/main: start process child")
        child = next(c for c in s.choices() if c.who == "child/main")
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10           # until the kill has landed (a zombie)
        while _state(child.pid) not in ("Z", None) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ChoiceError, match=r"child/main cannot step: its process \(pid "
                                              rf"{child.pid}\) has ended \(killed by SIGKILL\)"):
            s.step(child)
        assert "child/main" not in " ".join(s.history)
        with pytest.raises(ChoiceError, match="killed by SIGKILL"):
            s.step("child/main")


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _pickle_error(obj):
    """What pickle itself says when it cannot pickle `obj` (its wording changes with Python)."""
    try:
        pickle.dumps(obj)
    except TypeError as exc:
        return str(exc)
    raise AssertionError(f"{obj!r} pickled")


def test_step_refuses_an_open_file_argument_saying_what_to_pass():
    with open(__file__) as f:
        pickle_says = re.escape(_pickle_error(f))    # (3.13 words it apart from 3.11)
        with pytest.raises(TypeError, match=r"argument 1 \(an open file\) cannot travel.*"
                                            r"pickle says: " + pickle_says +
                                            r"\. Fix: pass plain data"):
            mpviz.step(w.sleeper, f)


KERNEL = """
import mpviz, stepper_workers as w
s = mpviz.step(w.two_locks)
print(s._dir, flush=True)
import sys; sys.stdin.read()
"""


def test_a_killed_kernels_run_dir_is_removed_by_the_next_stepper():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(mpviz.__file__)), os.path.dirname(__file__)]))
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True)
    try:
        run_dir = kernel.stdout.readline().strip()
        assert run_dir.startswith(os.path.join(tempfile.gettempdir(), "mpviz-step-"))
        assert os.path.isdir(run_dir)
    finally:
        kernel.kill()
        kernel.wait()
    assert os.path.isdir(run_dir)          # nobody closed it
    try:
        with mpviz.step(w.crash) as s:
            s.run_until(lambda s: False)
        assert not os.path.exists(run_dir), "the next Stepper left the dead kernel's run dir"
    finally:
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)
