"""The README is the entrance: short enough to read at the door, and true about the workshop.

It says what mpviz is, the two set-up commands, the workshop's notebooks, one picture, and where
to go next; the rest (tracing, speed, internals) lives in docs/. A README that grows back past
MAX_LINES buries the two commands again; a notebook missing from its table is a lesson nobody
finds. Cheap: text is read, nothing is run.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 150


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_readme_stays_at_most_150_lines():
    n = len(_readme().splitlines())
    assert n <= MAX_LINES, (
        f"README.md has {n} lines, more than {MAX_LINES}: it is the entrance (what mpviz is, the "
        f"two set-up commands, the workshop, one picture, where to go next). Fix: move the detail "
        f"to docs/ (TRACE.md, INTERNALS.md, PERFORMANCE.md) and link it")


def test_the_readme_gives_the_two_set_up_commands_as_commands():
    lines = _readme().splitlines()
    for command in ("./run workshop", "./run test"):
        assert f"    {command}" in lines, (
            f"README.md does not give `{command}` on a line of its own (an indented code line). "
            f"Fix: keep the two set-up commands as they are: one opens the workshop, one runs "
            f"the whole test suite")


def test_every_notebook_has_a_row_in_the_workshop_table():
    rows = set(re.findall(r"^\| `(\d\d_\w+)` \|", _readme(), re.M))
    notebooks = {f[:-len(".ipynb")] for f in os.listdir(os.path.join(ROOT, "notebooks"))
                 if re.fullmatch(r"\d\d_\w+\.ipynb", f)}
    assert notebooks - rows == set(), (
        f"notebooks with no row in README.md's workshop table: {sorted(notebooks - rows)}. "
        f"Fix: add a row `| `NN_name` | what you will see |`")
    assert rows - notebooks == set(), (
        f"README.md's workshop table names notebooks that do not exist: {sorted(rows - notebooks)}")
