"""mpviz.exercises: check() accepts the solutions' answers, rejects wrong ones with a reason,
and treats the notebooks' placeholder ``...`` as "not answered yet" without running anything.

The right answers are taken from notebooks/solutions/*.md as written: each python block there is
run with ``check`` replaced by a recorder of verdicts. Every judge runs the real case (a scenario,
a spawn Pool, a recorded program), so these tests start real processes.
"""
import json
import re
from pathlib import Path

import pytest

import mpviz as torch
import mpviz.exercises as ex
import mpviz.multiprocessing as mp
from mpviz.examples import notebook_workers as nw
from mpviz.examples import notebook_workers_2 as nw2

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "notebooks" / "solutions"
# the notebooks whose exercise cells are in place (00, 02, 03 and 06 get theirs separately)
NOTEBOOKS_WITH_CELLS = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "11",
                        "12", "13", "14"]
ALL = ex.exercises()
# notebook 13's exercises that run real torch (a DataLoader): where torch is not installed (the
# 3.13/3.14 chroots) every answer gets nb13.NEED_TORCH, which says so and how to install it
JUDGED_BY_TORCH = {"13.picture-collate", "13.predict-own-rng", "13.fix-timeout"}


def skip_where_torch_judges(exercise_id):
    """Skip a test of how `exercise_id` judges answers where its judge would run torch and torch
    is not installed (its only verdict there is nb13.NEED_TORCH)."""
    from mpviz.exercises import nb13
    if exercise_id in JUDGED_BY_TORCH and not nb13._torch():
        pytest.skip(f"{exercise_id} is judged by running real torch: torch is not installed")


def solution_blocks(number):
    """The python blocks of notebook `number`'s solutions file."""
    [path] = SOLUTIONS.glob(f"{number}_*.md")
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def _local_square(x):               # a function a spawn Pool can import, but it does not square
    return x + 1


def _returns_quietly():             # a "fix" that never tells the parent anything
    return None


# one wrong answer per exercise, each wrong for a reason the verdict must give
WRONG = {
    "00.predict-first-copy": 4 * 2**20,
    "00.fix-producer-exits": {"unit": 0.2},
    "00.picture-message-bytes": 2**20,
    "01.predict-chunksize": 10,
    "01.fix-chunksize": {"chunksize": 2},
    "01.picture-chunks": 5,
    "02.predict-view": (4, 32),
    "02.fix-nonleaf": "y",
    "02.picture-segments": 2,
    "03.predict-producer-exits-fs": "error",
    "03.fix-too-many-fds": {"limit": 1024},
    "03.picture-leak": 0,
    "04.predict-small-item": "deadlock",
    "04.fix-spawn-pool": _local_square,
    "04.picture-owner": "MainThread",
    "05.predict-copies": (3, 20),
    "05.fix-copies": {"reuse": False, "pool": 1},
    "05.picture-red-boxes": 8,
    "06.predict-held": (0, 0),
    "06.fix-repass": {"clone": False},
    "06.picture-producer-gone": False,
    "07.predict-exit": ("ProcessRaisedException", 3, None),
    "07.fix-hear-early": _returns_quietly,
    "07.picture-late-news": 0,
    "08.predict-spawn": False,
    "08.fix-fork": {"start_method": "spawn"},
    "08.picture-epochs": 2,
    "09.play-fork-held-lock": "deadlock",
    "09.play-queue-feeder-hang": None,
    "09.play-lock-order": "s",
    "09.picture-lock-order": "A",
    "09.fix-lock-order": {"start_method": "spawn"},
    "09.play-lost-wakeup": {},
    "09.predict-small-item": True,
    "09.play-torn-read": 1,
    "11.predict-autograd-forkserver": "error",
    "11.fix-small-shm": {"workers": 5},
    "12.predict-ring-bytes": 1024,
    "12.picture-ring": 222,
    "12.fix-set-epoch": {"seed": 1},
    "13.picture-collate": 3,
    "13.predict-own-rng": 4,
    "13.fix-timeout": {"persistent_workers": True},
    "13.fix-oom-cache": {"num_workers": 1},
    "13.fix-cow-list": {"gc_freeze": True},
    "11.predict-forkserver-global": "error",
    "11.picture-small-shm": 8,
    "14.predict-spawn-logging": ["INFO", "WARNING"],
    "14.fix-orphan": {"daemon": True},
    "14.picture-stack": "stuck_in_get",
}


def test_every_notebook_has_the_three_kinds():
    for number in ex.NOTEBOOKS:
        kinds = {e.kind for e in ex.exercises(number).values()}
        assert {"predict", "fix", "picture"} <= kinds <= set(ex.KINDS), (number, kinds)
    assert set(WRONG) == set(ALL), "every exercise needs a wrong answer in WRONG"


@pytest.mark.parametrize("number", NOTEBOOKS_WITH_CELLS)
def test_notebook_cells_call_check_with_a_placeholder(number):
    """Each exercise of the notebook has its cell, with the placeholder, and no hidden solution
    cell is left in the notebook."""
    [path] = (ROOT / "notebooks").glob(f"{number}_*.ipynb")
    cells = json.loads(path.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for exercise_id, exercise in ex.exercises(number).items():
        # a puzzle's check takes the stepper the learner stepped, `s`: run as it is, it says
        # how far the run got
        answer = r"s\)" if exercise.kind == "play" else r"\(?\.\.\."
        assert re.search(rf'check\("{re.escape(exercise_id)}", {answer}', code), exercise_id
    assert not [c for c in cells if "solution" in c.get("metadata", {}).get("tags", [])]


def test_the_placeholder_runs_nothing(monkeypatch):
    def no_runs(*args, **kwargs):
        raise AssertionError("a placeholder answer must not run anything")
    monkeypatch.setattr(ex.base.scenarios, "run", no_runs)
    monkeypatch.setattr(ex.base, "_run_cached", no_runs)
    for exercise_id, exercise in ALL.items():
        for placeholder in (..., (..., ...), {"chunksize": ...}):
            verdict = ex.judge(exercise_id, placeholder)
            assert verdict.right is None and exercise.question in verdict.why


def test_check_prints_not_answered_yet(capsys):
    ex.check("01.predict-chunksize", ...)
    out = capsys.readouterr().out
    assert out.startswith("01.predict-chunksize: Not answered yet.")
    assert "Replace ... with a number of units" in out.replace("\n", " ")


def test_unknown_id_and_wrong_form():
    with pytest.raises(ValueError, match="no exercise '01.nope'.*01.predict-chunksize"):
        ex.check("01.nope", 3)
    with pytest.raises(TypeError):
        ex.check(1, 3)
    verdict = ex.judge("01.predict-chunksize", "twelve")        # a typo is "not quite", no crash
    assert verdict.right is False and "not a number" in verdict.why
    verdict = ex.judge("11.fix-small-shm", {"shm_mb": 128})     # the fix must keep shm_mb=64
    assert verdict.right is False and "keeps shm_mb=64" in verdict.why


@pytest.mark.timeout(240)
@pytest.mark.parametrize("number", list(ex.NOTEBOOKS))
def test_solutions_are_right(number, monkeypatch):
    verdicts = {}

    def recorder(exercise_id, answer=...):
        verdicts[exercise_id] = ex.judge(exercise_id, answer)

    monkeypatch.setattr(ex, "check", recorder)
    for block in solution_blocks(number):
        exec(compile(block, f"solutions/{number}", "exec"), {"__name__": "solutions"})
    assert set(verdicts) == set(ex.exercises(number)), "one solution per exercise"
    wrong = {k: v.why for k, v in verdicts.items() if v.right is not True}
    from mpviz.exercises import nb13
    if number == "13" and not nb13._torch():    # those judged by torch say to install it
        assert {k: why for k, why in wrong.items() if why == nb13.NEED_TORCH} == dict.fromkeys(
            JUDGED_BY_TORCH, nb13.NEED_TORCH), wrong
        wrong = {k: why for k, why in wrong.items() if k not in JUDGED_BY_TORCH}
    assert not wrong


@pytest.mark.timeout(240)
@pytest.mark.parametrize("exercise_id", list(ALL))
def test_a_wrong_answer_is_rejected_with_why(exercise_id, monkeypatch):
    skip_where_torch_judges(exercise_id)
    if exercise_id == "13.fix-timeout":   # its wrong answer waits for ever: stop it after 3 s,
        from mpviz.exercises import nb13  # not the 10 s a learner's fix is given
        monkeypatch.setattr(nb13, "LIMIT_S", 3)
    verdict = ex.judge(exercise_id, WRONG[exercise_id])
    assert verdict.right is False
    assert len(verdict.why) > 40, verdict.why         # a reason, not just "no"
    if exercise_id == "13.fix-timeout":
        assert "still waiting" in verdict.why and "after 3 s" in verdict.why, verdict.why


def test_a_notebook_function_is_refused_by_the_spawn_pool_fix():
    """The fix exercise of 04 really runs a spawn Pool: a function from __main__ cannot go."""
    namespace = {"__name__": "__main__"}
    exec("def square(x):\n    return x * x\n", namespace)
    verdict = ex.judge("04.fix-spawn-pool", namespace["square"])
    assert verdict.right is False and "__main__" in verdict.why


def test_names_used_by_the_solutions_exist():
    # the solutions use these objects; keep them importable under the same names
    assert callable(nw.square) and callable(nw2.fail_on) and callable(mp.spawn)
    assert torch.ones(3, requires_grad=True).requires_grad


def test_a_pair_answer_that_is_not_a_pair_of_numbers_says_which_pair():
    from mpviz.exercises.base import BadAnswer, as_number_pair
    shape = "(storage_offset, storage_bytes), e.g. (0, 16)"
    assert as_number_pair([4, 32], shape, "a number") == (4, 32)
    for bad in (16, (1, 2, 3), "0, 16"):
        with pytest.raises(BadAnswer, match=re.escape(f"is a pair: {shape}, not")):
            as_number_pair(bad, shape, "a number")
    with pytest.raises(BadAnswer, match="is not a number of bytes"):
        as_number_pair((1, "2"), shape, "a number of bytes")
