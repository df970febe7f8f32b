"""Stepping real processes by hand (mpviz.stepper) and the puzzles (mpviz.scenarios.puzzles).

Every test starts real processes (a fresh driver interpreter, forked or spawned children) that
really pause in the recorder's hooks; the leak check (conftest.py) then finds nothing left.
"""
import os
import time
from typing import NamedTuple

import pytest

import mpviz
import mpviz.scenarios as sc
import stepper_workers as w
from mpviz.scenarios.puzzles import PUZZLES
from mpviz.stepper import ChoiceError, gate, random_schedules
from mpviz import _stops
from mpviz.trace import session

pytestmark = pytest.mark.timeout(180)

GOALS = {"fork-held-lock": "deadlock", "queue-feeder-hang": "deadlock", "lock-order": "deadlock",
         "lost-wakeup": "deadlock", "torn-read": "race"}
# every (puzzle, start method) whose goal is reachable: all of them, but fork-held-lock under
# spawn and forkserver (a fresh interpreter makes a fresh lock: that is its fix)
GOAL_CASES = [(n, m) for n, p in PUZZLES.items() for m in p.goal_schedules]


def play(stepper, schedule, offered=None):
    """Step the entries of `schedule` in order (each a who, or the start of a label, that must
    be a choice), then the first choice until the end; return the outcome. `offered`: a list
    that gets the labels offered before each step of the schedule."""
    for entry in schedule:
        labels = [c.label for c in stepper.choices()]
        if offered is not None:
            offered.append(labels)
        assert any(label == entry or label.startswith(entry + ":") or
                   ": " in entry and label.startswith(entry) for label in labels), \
            f"{entry} is not offered after {stepper.history}: {labels}"
        stepper.step(entry)
    return stepper.run_until(lambda s: False)


class GoalRun(NamedTuple):
    """What one run of a puzzle's goal schedule showed (the run itself is closed at once)."""
    goal: str
    outcome: str
    explanation: str
    threads: dict                # who -> status, at the end
    offered: list                # the labels offered before each step of the schedule
    history: list


@pytest.fixture(scope="module")
def goal_run():
    """goal_run(name, start_method): play that puzzle's goal schedule once per module; several
    tests read the same run (each run costs a second or more of real processes)."""
    runs = {}

    def get(name, start_method):
        if (name, start_method) not in runs:
            offered = []
            with sc.step(name, start_method=start_method) as s:
                outcome = play(s, PUZZLES[name].goal_schedule_for(start_method), offered)
                runs[name, start_method] = GoalRun(s.goal, outcome, s.explanation,
                                                   dict(s.state().threads), offered,
                                                   list(s.history))
        return runs[name, start_method]
    return get


def test_not_stepping_costs_a_none_check():
    assert _stops.pause is None         # the hooks' slot, in a process that is not stepped


def test_fork_held_lock_one_schedule_deadlocks_another_is_ok(goal_run):
    run = goal_run("fork-held-lock", "fork")
    assert run.outcome == "deadlock"
    assert run.threads["child/main"] == (
        "blocked in: acquire lock L (held by main/library-worker: the copy fork made of it, "
        "whose holder was not copied -- nobody here can release it)")
    with sc.step("fork-held-lock") as s:      # the same parameters: release before the fork
        assert play(s, ["main/library-worker", "main/library-worker", "main/main"]) == "ok"


@pytest.mark.parametrize("name,start_method", GOAL_CASES)
def test_each_puzzle_goal_is_reachable(goal_run, name, start_method):
    run = goal_run(name, start_method)
    assert run.goal
    assert run.outcome == GOALS[name], run.explanation
    assert run.explanation.startswith("Goal reached")


def test_a_puzzle_fixed_by_its_start_method_has_no_goal_schedule_for_it():
    with pytest.raises(ValueError, match="(?s)no schedule reaches its goal with start_method="
                                         "'spawn'.*Fix: start_method one of 'fork'"):
        PUZZLES["fork-held-lock"].goal_schedule_for("spawn")


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_spawned_child_attaches_the_tensors_it_is_given(goal_run, start_method):
    # torn-read passes tensors as Process arguments: under spawn and forkserver each child maps
    # their shared memory before its first line (a stop each); a forked child inherits them
    run = goal_run("torn-read", start_method)
    attach = [x for x in run.history if " attach shared memory " in x]
    assert [x.split(":")[0] for x in attach] == ["producer/main", "consumer/main",
                                                 "consumer/main"], run.history
    assert all(x.endswith("(16 B, from its Process arguments)") for x in attach), attach
    assert all("mpviz_" in x for x in attach), attach
    forked = [label for labels in goal_run("torn-read", "fork").offered for label in labels]
    assert not [x for x in forked if "attach" in x], forked


@pytest.mark.parametrize("name", list(PUZZLES))
def test_each_fix_survives_random_schedules(name):
    fix = PUZZLES[name].fix
    outcomes, examples = random_schedules(lambda: sc.step(name, **fix), n=4, seed=1)
    assert outcomes == {"ok": 4}, examples


def test_torn_reads_fix_survives_random_schedules_with_attach_stops():
    # under spawn the children's attach stops add interleavings: the lock must still hold
    outcomes, examples = random_schedules(
        lambda: sc.step("torn-read", lock=True, start_method="spawn"), n=4, seed=2)
    assert outcomes == {"ok": 4}, examples


def test_fixed_puzzle_survives_the_goal_schedule_prefix():
    # the schedule that breaks lock-order, tried on the fix: child cannot take B before A
    with sc.step("lock-order", same_order=True) as s:
        s.step("main/main")
        s.step("main/main")               # main takes A
        assert "acquire lock A (held by main/main)" in \
            [c.text for c in s.choices() if c.who == "child/main"]
        assert s.run_until(lambda s: False) == "ok"


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_opposite_lock_order_deadlocks_under_every_start_method(goal_run, start_method):
    run = goal_run("lock-order", start_method)
    assert run.outcome == "deadlock"
    assert run.threads["main/main"] == "blocked in: acquire lock B (held by child/main)"
    assert run.threads["child/main"] == "blocked in: acquire lock A (held by main/main)"


def test_a_choice_not_offered_is_a_clear_error():
    with mpviz.step(w.two_locks) as s:
        with pytest.raises(ChoiceError, match=r"(?s)not a choice now.*0: main/main: start "
                                              r"process child"):
            s.step("child/main")
        with pytest.raises(ChoiceError, match="not a choice"):
            s.step(5)
        with pytest.raises(TypeError):
            s.step(1.5)


def test_a_crashed_process_is_shown_ended_and_the_rest_go_on():
    with mpviz.step(w.child_crashes) as s:
        s.step("main/main")                 # start the child, which exits with code 3
        assert [c.who for c in s.choices()] == ["main/main"]
        assert s.run_until(lambda s: False) == "error"
        assert "child (ended (exit code 3))" in s.explanation


def test_undo_replays_all_but_the_last_step():
    with mpviz.step(w.two_locks) as s:
        s.step("main/main")
        s.step("child/main")
        before = [c.label for c in s.choices()]
        s.step("main/main")
        s.undo()
        assert len(s.history) == 2
        assert [c.label for c in s.choices()] == before


def test_close_ends_paused_and_blocked_processes():
    s = mpviz.step(w.two_locks)               # your own function: the lock-order program
    assert play(s, ["main/main", "main/main", "child/main", "main/main", "child/main"]) \
        == "deadlock"
    threads = dict(s.state().threads)
    assert threads["main/main"] == "blocked in: acquire lock B (held by child/main)"
    assert threads["child/main"] == "blocked in: acquire lock A (held by main/main)"
    assert s.choices() == []
    sid = s._proc.pid
    s.close()
    assert session.session_pids(sid) == []
    assert s.outcome == "deadlock"


def test_a_paused_process_ends_itself_when_its_controller_goes_away():
    s = mpviz.step(w.two_locks)
    s.step("main/main")
    sid = s._proc.pid
    assert session.session_pids(sid)
    s._closing = True                         # the controller stops answering and hangs up
    s._io.join(5)
    deadline = time.monotonic() + 10
    while session.session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.05)                      # polling other processes' exit, bounded
    left = session.session_pids(sid)
    s._closing = False
    s.close()
    assert left == []


def test_a_notebook_function_is_refused_with_the_fix():
    def local():
        pass
    with pytest.raises(ValueError, match="Fix: define it at the top level of a module"):
        mpviz.step(local)


def test_unknown_puzzle_and_parameter_are_clear_errors():
    with pytest.raises(ValueError, match="the puzzles are: fork-held-lock"):
        sc.step("nope")
    with pytest.raises(ValueError, match="its parameters are"):
        sc.step("lock-order", sideways=True)
    assert os.environ.get(gate.ENV) is None


@pytest.fixture(scope="module")
def fonts_loaded():
    """matplotlib opens its font files once per thread and keeps them: not a leak of the test."""
    import io
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.set_title("warm up")
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def test_widget_clicks_through_a_puzzle_to_its_goal_and_undoes(fonts_loaded):
    from mpviz.widgets import Stepper
    wdg = Stepper("lock-order")
    try:
        assert "Goal:" in wdg.goal.value
        assert [b.description for b in wdg.buttons.children] == ["main/main: start process child"]
        for step in PUZZLES["lock-order"].goal_schedule[:-1]:
            wdg.click(step)
        [last] = [b for b in wdg.buttons.children if b.description.startswith("child/main")]
        last.click()                                  # a real button click, as a learner's
        assert "outcome: deadlock" in wdg.outcome.value
        assert wdg.buttons.children == ()
        assert wdg.picture.outputs[0]["data"]["image/png"]
        wdg.undo_button.click()                       # restart and replay all but the last
        assert "running" in wdg.outcome.value
        assert [b.description for b in wdg.buttons.children] == \
            ["child/main: acquire lock A (held by main/main)"]
    finally:
        wdg.close()


def _always_the_first_choice(s):
    """Step s to its end, always taking the first choice; return the labels taken, in order."""
    seen = []
    while s.choices():
        c = s.choices()[0]
        seen.append(c.label)
        s.step(c)
    return seen


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_condition_and_pipe_are_stops(start_method):
    with mpviz.step(w.condition_and_pipe, start_method) as s:
        seen = _always_the_first_choice(s)
        assert s.outcome == "ok", s.explanation
        assert "main/main: wait on condition C (releases its lock, sleeps until notified)" in seen
        assert "child/main: notify condition C" in seen
        assert "main/main: receive from a pipe (waits for a message)" in seen
        assert "child/main: acquire lock C.lock (free)" in seen     # main released it in wait
        [attach] = [x for x in seen if " attach shared memory " in x]   # the tensor's memory
        assert attach.startswith("main/main: attach shared memory mpviz_"), seen
        assert attach.endswith(" (32 B, from a pipe)"), seen


@pytest.mark.parametrize("strategy", ["file_system", "file_descriptor"])
def test_an_mpviz_queues_put_and_get_and_the_attach_are_stops(strategy):
    with mpviz.step(w.mpviz_queue_tensor, "fork", strategy) as s:
        seen = _always_the_first_choice(s)
        assert s.outcome == "ok", s.explanation
        assert any(x.startswith("child/main: put an item on queue Q (written into its pipe now")
                   for x in seen), seen
        assert "main/main: get an item from queue Q" in seen, seen
        # then main maps the tensor's memory: a stop of its own, after the get
        [attach] = [x for x in seen if " attach shared memory " in x]
        assert attach.startswith("main/main: attach shared memory mpviz_"), seen
        assert attach.endswith(" (4 KiB, from queue Q)"), seen
        assert seen.index(attach) > seen.index("main/main: get an item from queue Q")


# --- in the real browser: JupyterLab in headless Chromium (see tests/test_browser.py) ----------

@pytest.mark.browser
@pytest.mark.timeout(300)
@pytest.mark.parametrize("flavour", ["lab", "notebook"])
def test_browser_clicks_a_puzzle_to_its_goal(tmp_path, flavour):
    """tests/browser/stepper.ipynb shows Stepper("lock-order"); click its choice buttons along
    the goal schedule, as a learner would, until the outcome says deadlock; then Close. In
    JupyterLab and in Notebook 7."""
    from browser.harness import BrowserRun, skip_if_asked
    skip_if_asked()
    here = os.path.dirname(os.path.abspath(__file__))
    run = BrowserRun(os.path.join(os.path.dirname(here), "artifacts", "browser",
                                  f"stepper-{flavour}"), tmp_path)
    try:
        nb = run.open_notebook(os.path.join(here, "browser", "stepper.ipynb"), copy_dir=False,
                               flavour=flavour)
        nb.run_all()
        root = nb.page.locator(".mpviz-stepper").first
        root.wait_for(state="visible", timeout=60_000)
        for n, step in enumerate(PUZZLES["lock-order"].goal_schedule, 1):
            button = root.locator(".mpviz-choice", has_text=step).first   # (a label's start)
            button.wait_for(state="visible", timeout=30_000)
            button.click()
            root.locator(".mpviz-state", has_text=f"{n} step(s) taken").wait_for(timeout=30_000)
            run.screenshot(f"step-{n}", root)
        root.locator(".mpviz-outcome", has_text="outcome: deadlock").wait_for(timeout=30_000)
        assert root.locator(".mpviz-choice").count() == 0
        assert root.locator(".widget-output img").first.is_visible()
        run.screenshot("goal", root)
        root.locator(".mpviz-close").first.click()
        root.locator(".mpviz-outcome", has_text="closed").wait_for(timeout=30_000)
        assert not nb.errors()
    finally:
        problems = run.close()
    assert not problems, problems


def test_an_event_is_one_stop_not_its_inner_condition(goal_run):
    # Event.set calls its own Condition's notify_all: the learner sees one stop, "set event ready"
    run = goal_run("lost-wakeup", "fork")
    assert run.history[:3] == ["main/main: start process consumer",
                               "main/main: start process producer",
                               "producer/main: set event ready"]
    assert [x for x in run.offered[3] if x.startswith("producer/main")] == \
        ["producer/main: set event ready"]


def test_a_thread_blocked_after_its_step_is_not_said_to_be_in_that_step(goal_run):
    # the child's put returned at once; the child is blocked at its exit, joining its feeder
    run = goal_run("queue-feeder-hang", "fork")
    assert run.outcome == "deadlock"
    threads = run.threads
    assert threads["child/main"] == ("blocked in futex: a lock, a semaphore or a thread's end; "
                                     "its last step: put an item on queue Q (into its buffer: "
                                     "the feeder thread writes it)")
    assert threads["child/QueueFeederThread"].startswith("blocked in: write 1,048,585 bytes")
    assert threads["main/main"] == "blocked in: join process child (wait until it has ended)"


def test_run_until_and_run_freely():
    with mpviz.step(w.two_locks, same_order=True) as s:
        s.run_until(lambda s: any("held by" in c.text for c in s.choices()))
        assert any("held by" in c.text for c in s.choices())
        assert s.outcome is None
        assert s.run_freely() == "ok"            # same order: no timing can deadlock it


def test_the_wait_for_graph_of_opposite_lock_orders_names_two_locks_as_the_choices_do():
    # take_both(first, second) runs with (A, B) in main and (B, A) in the child, so both locks
    # are waited for under one variable name, `second`: that name tells them apart no more. The
    # graph must show two locks, called as the choices call them (docs/TRACE.md shows this one).
    import matplotlib.text
    from mpviz import viz
    with sc.step("lock-order") as s:
        for who in ("main/main", "main/main", "child/main", "main/main", "child/main"):
            s.step(who)
        trace = s.trace.snapshot()
        waited = {e.args["lock"] for e in trace.events if e.kind == "lock.wait"}
        assert len({viz.lock_name(trace, lock) for lock in waited}) == 2
        words = " ".join(t.get_text() for t in s.wait_for().findobj(matplotlib.text.Text))
    words = " ".join(words.split())
    assert "main's main thread waits for lock B, which child's main thread holds" in words
    assert "child's main thread waits for lock A, which main's main thread holds" in words


def test_a_program_killed_by_a_signal_is_not_said_to_have_raised():
    with mpviz.step(w.main_killed) as s:
        assert s.run_until(lambda s: False) == "error"
        assert "raised an exception" not in s.explanation
        assert "killed by SIGKILL" in s.explanation
