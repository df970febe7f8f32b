"""Every check can fail: no exercise says "Right." to an empty answer, to the broken program as
it stands, to a plausible wrong answer, or to an odd one; and no answer hangs, crashes or floods
the check.

A fix exercise starts from a broken program. Its empty answer ``{}`` must mean "change nothing",
so it runs the broken program, not the scenario's defaults (which, for 05.fix-copies and
08.fix-fork, are already the fix). Restating a parameter at its default changes nothing either.
Checks that run the learner's function do it where ``os._exit`` cannot take the kernel along,
and within a time limit.
"""
import os
import time

import numpy as np
import pytest

import mpviz.exercises as ex
from mpviz import scenarios
from test_exercises import skip_where_torch_judges

ALL = ex.exercises()
FIXES = {k: e for k, e in ALL.items() if hasattr(e.judge, "broken")}   # fix_scenario's

# the wrong answers a learner plausibly tries first (restating what is already there)
PLAUSIBLE = {
    "05.fix-copies": [{"pool": 2}, {"strategy": "file_system"}, {"producers": 3}],
    "08.fix-fork": [{"nprocs": 4}, {"start_method": "fork"}],
    "00.fix-producer-exits": [{"strategy": "file_descriptor"}],
    "01.fix-chunksize": [{"chunksize": None}],
    # notebook 12: the whole tensor once, twice the answer, one chunk; the full sum (222), the
    # input (2); a new seed, no shuffling, set_epoch with no shuffling
    "12.predict-ring-bytes": [1024, 3072, 256],
    "12.picture-ring": [222, 2, 22],
    "12.fix-set-epoch": [{"seed": 1}, {"shuffle": False}, {"set_epoch": False},
                         {"set_epoch": True, "shuffle": False}],
    # notebook 13's memory fixes run a program: its default restated, one worker instead of two
    # (it then caches all 64 images alone), no worker; gc.freeze(), the fix most often suggested
    "13.fix-oom-cache": [{"cache_items": None}, {"num_workers": 1}, {"num_workers": 0}],
    "13.fix-cow-list": [{"storage": "list"}, {"gc_freeze": True}],
}


def _recursive_list():
    loop = [1]
    loop.append(loop)
    return loop


ODD = {
    "a 10 MB string": "x" * 10_000_000,
    "10**400": 10**400,
    "a list that holds itself": _recursive_list(),
    "a NumPy array": np.array([1, 2]),
    "NaN": float("nan"),
    "a dict holding an array": {"chunksize": np.array([1, 2])},
}


def _scenario_of(exercise):
    return exercise.answer_form.split("a dict of ", 1)[1].split("'s parameters", 1)[0]


def _defaults_restated(exercise_id):
    """{name: default} for each parameter of the fix's scenario whose default the broken
    program already has: restating it changes nothing."""
    exercise = ALL[exercise_id]
    scenario = _scenario_of(exercise)
    broken = scenarios.resolve(scenario, exercise.judge.broken)
    return [{name: p.default} for name, p in scenarios.module(scenario).PARAMS.items()
            if p.default == broken[name]]


def assert_not_quite(exercise_id, answer):
    verdict = ex.judge(exercise_id, answer)
    assert verdict.right is False, (exercise_id, repr(answer)[:80], verdict.why)
    assert len(verdict.why) > 40, verdict.why            # a reason, not just "no"
    return verdict


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise_id", list(ALL))
def test_an_empty_answer_is_not_quite(exercise_id, monkeypatch):
    skip_where_torch_judges(exercise_id)
    if exercise_id == "13.fix-timeout":   # {} leaves the loader waiting for ever: stop it after
        from mpviz.exercises import nb13  # 3 s, not the 10 s a learner's fix is given
        monkeypatch.setattr(nb13, "LIMIT_S", 3)
    for empty in ({}, None, "", 0, ()):
        verdict = assert_not_quite(exercise_id, empty)
        if exercise_id == "13.fix-timeout" and isinstance(empty, dict):   # it ran, and waited
            assert "still waiting" in verdict.why and "after 3 s" in verdict.why, verdict.why


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise_id", list(FIXES))
def test_a_fix_that_restates_a_default_or_a_plausible_wrong_answer_is_not_quite(exercise_id):
    for answer in PLAUSIBLE.get(exercise_id, []):
        assert_not_quite(exercise_id, answer)
    for answer in _defaults_restated(exercise_id):
        assert_not_quite(exercise_id, answer)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("exercise_id", [k for k in PLAUSIBLE if k not in FIXES])
def test_a_plausible_wrong_answer_is_not_quite(exercise_id):
    skip_where_torch_judges(exercise_id)
    for answer in PLAUSIBLE[exercise_id]:
        assert_not_quite(exercise_id, answer)


@pytest.mark.parametrize("what", list(ODD))
def test_an_odd_answer_is_not_quite_quickly_and_summarised(what):
    answer = ODD[what]
    for exercise_id in ALL:
        start = time.monotonic()
        verdict = ex.judge(exercise_id, answer)
        took = time.monotonic() - start
        assert verdict.right is False, (exercise_id, verdict.why)
        assert len(verdict.why) < 2000, (exercise_id, verdict.why[:200])
        assert took < 20, (exercise_id, took)


def test_a_huge_answer_is_printed_in_a_line(capsys):
    start = time.monotonic()
    ex.check("01.predict-chunksize", "x" * 10_000_000)
    out = capsys.readouterr().out
    assert time.monotonic() - start < 2
    assert "a string of 10,000,000 characters" in out and len(out) < 1000


def test_numpy_numbers_are_numbers_and_impossible_numbers_say_why():
    from mpviz.exercises.base import BadAnswer, as_number
    assert as_number(np.float64(12.0)) == 12 and as_number(np.int64(3)) == 3
    for bad, said in ((10**400, "a number of 401 digits"), (float("nan"), "nan"),
                      (np.float64("inf"), "inf"), (True, "True")):
        with pytest.raises(BadAnswer, match=said):
            as_number(bad)


@pytest.mark.timeout(120)
def test_a_function_that_kills_its_process_gets_an_answer():
    """04 runs the learner's function in a spawn Pool, 07 in a forked child: os._exit there
    ends that process, not the check."""
    start = time.monotonic()
    verdict = assert_not_quite("04.fix-spawn-pool", os._exit)
    assert "died" in verdict.why, verdict.why
    verdict = assert_not_quite("07.fix-hear-early", _exits_at_once)
    assert "ended the process" in verdict.why, verdict.why
    assert time.monotonic() - start < 60


def _exits_at_once():
    os._exit(3)


def _sleeps():
    time.sleep(3600)


@pytest.mark.timeout(120)
def test_a_function_that_hangs_is_stopped_after_the_time_limit(monkeypatch):
    from mpviz.exercises import nb07
    monkeypatch.setattr(nb07, "_TIME_LIMIT_S", 2.0)
    verdict = assert_not_quite("07.fix-hear-early", _sleeps)
    assert "still running after 2 s" in verdict.why
