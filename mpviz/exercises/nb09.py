"""Exercises of notebook 09 (be the scheduler): the learner steps real processes; check reads the
stepper's outcome.

A puzzle is solved by the learner's own schedule: ``check("09.play-lock-order", s)`` takes the
``Stepper`` the learner stepped and asks it how its run ended (``s.outcome``). Nothing is
replayed for them: a run that has not reached the goal yet, a run of the fixed program, or a
closed run is "not quite", with the schedule taken so far.
"""
import functools

from .. import scenarios as sc
from .base import (BadAnswer, Exercise, Verdict, _measured, as_bool, as_kwargs, describe, judged,
                   measured, shown)

# the outcome each puzzle's goal is: a deadlock, except torn-read's mixed values
_GOAL_OUTCOME = {"fork-held-lock": "deadlock", "queue-feeder-hang": "deadlock",
                 "lock-order": "deadlock", "lost-wakeup": "deadlock", "torn-read": "race"}


def _puzzles():
    from ..scenarios.puzzles import PUZZLES
    return PUZZLES


def _schedule(history):
    if not history:
        return "no step taken yet"
    return "; ".join(f"{i}. {label}" for i, label in enumerate(history, 1))


def _play(puzzle_name):
    """The judge of one puzzle: is `answer` a stepper of this puzzle whose run reached the goal?"""
    @judged
    def judge(answer):
        from ..stepper.control import Stepper
        if not isinstance(answer, Stepper):
            raise BadAnswer(f"the answer is your stepper, the `s` you stepped (s = "
                            f"sc.step({puzzle_name!r}) ...), not {shown(answer)}")
        if answer.title != puzzle_name:
            raise BadAnswer(f"this stepper runs the puzzle {answer.title!r}, not "
                            f"{puzzle_name!r}. Fix: give the `s` of this puzzle's cells.")
        puzzle = _puzzles()[puzzle_name]
        fixed = {k: v for k, v in puzzle.fix.items() if answer.params.get(k) == v}
        if fixed:
            return Verdict(False, f"This run has the fix ({describe(fixed)}): no schedule "
                                  f"reaches the goal with it. Start the broken program, "
                                  f"sc.step({puzzle_name!r}), and step it to the goal.")
        outcome = answer.outcome
        steps = f"Your schedule so far: {_schedule(answer.history)}."
        goal = _GOAL_OUTCOME[puzzle_name]
        if outcome is None:
            choices = "; ".join(c.label for c in answer.choices())
            return Verdict(False, f"The run is still going: the goal ({puzzle.goal}) is not "
                                  f"reached yet. {steps}\n\nThe threads that can step now: "
                                  f"{choices}.")
        if outcome == "stopped":
            return Verdict(False, f"This run was closed before it ended. {steps} Fix: start "
                                  f"a new one, sc.step({puzzle_name!r}), and step it again.")
        if outcome != goal:
            return Verdict(False, f"Your run ended {outcome.upper()}, not {goal.upper()}: "
                                  f"{answer.explanation}\n\n{steps} Try another order: "
                                  f"s.close(), then a new sc.step({puzzle_name!r}).")
        return Verdict(True, f"Your run ended {outcome.upper()}, the goal. {steps}\n\n"
                             f"{answer.explanation}")
    return judge


def _goal_run(puzzle_name, **params):
    """Step the puzzle's known goal schedule with `params` and let the rest run: (outcome,
    explanation, state) at the end, or (None, why, None) when a step of it is not a choice
    (the params changed the program)."""
    from ..stepper.control import ChoiceError
    puzzle = _puzzles()[puzzle_name]
    with sc.step(puzzle_name, **params) as s:
        try:
            for label in puzzle.goal_schedule:
                s.step(label)
        except ChoiceError as exc:
            return None, str(exc).split("\n")[0], None
        s.run_until(lambda s: False)
        return s.outcome, s.explanation, s.state()


@measured
def _small_item():
    return _goal_run("queue-feeder-hang", nbytes=1024)


@judged
def _judge_predict(answer):
    guess = as_bool(answer)
    outcome, explanation, _ = _small_item()
    can_hang = outcome == "deadlock"
    return Verdict(guess == can_hang, (
        f"You said {guess}. The very schedule that hangs with 1 MiB (start the child, let it "
        f"put, main joins, then the feeder writes), stepped just now with nbytes=1024, ended "
        f"{str(outcome).upper()}: {explanation} A 1 KiB write fits in the pipe's 64 KiB, so "
        f"the feeder never waits for a reader, the child exits, and the join returns, whatever "
        f"the order."))


@functools.lru_cache(maxsize=None)
def _fix_outcomes(frozen):
    from ..stepper import random_schedules
    params = dict(frozen)
    outcome, explanation, _ = _goal_run("lock-order", **params)
    if outcome == "deadlock":
        return "goal", explanation
    outcomes, _ = random_schedules(lambda: sc.step("lock-order", **params), n=4)
    return "random", dict(outcomes)


_measured.append(_fix_outcomes)         # forget() drops these runs too


@judged
def _judge_fix(answer):
    from ..scenarios.puzzles import resolve
    as_kwargs(answer, "lock-order's parameters", "{'start_method': 'spawn'}")
    try:
        _, params = resolve("lock-order", answer)
    except (ValueError, TypeError) as exc:
        raise BadAnswer(f"lock-order cannot run with {describe(answer)}: "
                        f"{str(exc)[:300]}") from None
    how, what = _fix_outcomes(tuple(sorted(params.items())))
    if how == "goal":
        return Verdict(False, f"lock-order with {describe(answer)} still deadlocks: the "
                              f"schedule of puzzle 3 (main takes A, the child takes B, each "
                              f"then asks for the other) ended DEADLOCK again. {what}")
    if set(what) != {"ok"}:
        return Verdict(False, f"lock-order with {describe(answer)}: 4 random schedules ended "
                              f"{what}, not all OK.")
    return Verdict(True, f"lock-order with {describe(answer)}: puzzle 3's schedule is no "
                         f"longer possible (the child cannot take B first), and 4 random "
                         f"schedules all ended OK ({what}). With one global order, whoever "
                         f"holds A can always get B: no cycle can form. The notebook's "
                         f"all_schedules cell tries every schedule.")


@measured
def _who_main_waits_for():
    outcome, _explanation, state = _goal_run("lock-order")
    status = dict(state.threads).get("main/main", "")
    if outcome != "deadlock" or "acquire lock " not in status:
        raise RuntimeError(f"lock-order's goal schedule ended {outcome} with main {status!r}: "
                           f"the puzzle itself changed")
    return status.split("acquire lock ", 1)[1].split()[0], status, state.locks


@judged
def _judge_picture(answer):
    if not isinstance(answer, str):
        raise BadAnswer(f"the answer is the lock's name as a string, e.g. 'A', not "
                        f"{shown(answer)}")
    lock, status, holders = _who_main_waits_for()
    said = answer.strip().lower().replace("lock", "").strip()
    held = ", ".join(f"lock {k} by {v}" for k, v in sorted(holders.items()))
    return Verdict(said == lock.lower(), (
        f"You said {shown(answer)}; at the deadlock main is {status}. The locks are held so: "
        f"{held}. In the wait-for graph the arrows go owner → lock → waiter and close a "
        f"cycle: main holds A and waits for B, the child holds B and waits for A."))


EXERCISES = [
    Exercise("09.play-fork-held-lock", "play",
             "Puzzle 1: step fork-held-lock until the child waits forever for lock L.",
             "your stepper, s", _play("fork-held-lock")),
    Exercise("09.play-queue-feeder-hang", "play",
             "Puzzle 2: step queue-feeder-hang until main waits forever in join().",
             "your stepper, s", _play("queue-feeder-hang")),
    Exercise("09.play-lock-order", "play",
             "Puzzle 3: step lock-order until main and the child each hold one lock and wait "
             "for the other.", "your stepper, s", _play("lock-order")),
    Exercise("09.picture-lock-order", "picture",
             "In the wait-for graph at the end of puzzle 3, which lock does main wait for?",
             "the lock's name as a string, e.g. 'A'", _judge_picture),
    Exercise("09.fix-lock-order", "fix",
             "Give lock-order the parameters under which no schedule deadlocks.",
             "a dict of lock-order's parameters, e.g. {'name': value}", _judge_fix),
    Exercise("09.play-lost-wakeup", "play",
             "Puzzle 4: step lost-wakeup until the consumer waits forever although both items "
             "were made.", "your stepper, s", _play("lost-wakeup")),
    Exercise("09.predict-small-item", "predict",
             "queue-feeder-hang with nbytes=1024 (main still joins before it gets): can any "
             "schedule make main wait forever in join()?",
             "True (some schedule hangs) or False (none does)", _judge_predict),
    Exercise("09.play-torn-read", "play",
             "Puzzle 5: step torn-read until the consumer reads values part old, part new.",
             "your stepper, s", _play("torn-read")),
]
