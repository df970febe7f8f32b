"""A trace read by another copy of mpviz -- the other host's trace in a merged job, a trace
recorded in one checkout and opened in a notebook of another -- names the same user's line.

The watchdog keeps each stuck process's stacks as faulthandler printed them, with the paths of
the machine that recorded them; "your line" is the first frame that is neither the stdlib's nor
mpviz's. Judged by the reader's own paths only, the recorder's mpviz frames were the user's:
"STUCK FOR GOOD: ... (at your line waits.py:68 in _recorded(): `result = call(*args, **kwargs)`)"
on the picture, where the recording mpviz had said hang_join.py:28.
"""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(120)

READ = """
import sys
import mpviz, mpviz.trace as mt
from mpviz.trace import analysis
assert mpviz.__file__.startswith(sys.argv[2]), mpviz.__file__      # the other copy
for d in analysis.deadlocks(mt.load(sys.argv[1])):
    print(d.pid, d.reason)
"""


def test_another_copy_of_mpviz_names_the_users_line_the_recorder_named(tmp_path):
    out = tmp_path / "trace"
    run = subprocess.run([sys.executable, "-m", "mpviz", "trace", "--hang-after", "2",
                          "--no-plot", "-o", str(out), "--", sys.executable,
                          os.path.join(ROOT, "notebooks", "programs", "hang_join.py")],
                         capture_output=True, text=True, timeout=90)
    assert run.returncode == 124, run.stderr
    assert "main (hang_join.py:28)" in run.stderr
    other = tmp_path / "elsewhere"                  # the same mpviz, at another path
    shutil.copytree(os.path.join(ROOT, "mpviz"), other / "mpviz",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(other))
    read = subprocess.run([sys.executable, "-c", READ, str(out), str(other)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert read.returncode == 0, read.stderr
    reasons = read.stdout
    assert "at your line hang_join.py:28 in main()" in reasons, reasons
    assert "waits.py" not in reasons and "hooks.py" not in reasons, (
        f"the recorder's own mpviz frames were called the user's line: {reasons}")


def test_a_recorders_checkout_named_mpviz_is_still_known_for_mpviz():
    """`git clone .../mpviz` makes /src/mpviz/mpviz/...: the file's name follows the *second*
    "/mpviz/", which overlaps the first (the 3.13/3.14 chroots run this checkout from /src/mpviz,
    and the test above failed there: 'at your line waits.py:68 in _recorded()')."""
    from mpviz.trace import analysis
    for where in ("/src/mpviz", "/home/ann/mpviz/mpviz", "/srv/x"):
        assert analysis._is_machinery(f"{where}/mpviz/trace/waits.py"), where
        assert analysis._is_machinery(f"{where}/mpviz/multiprocessing/queues.py"), where
        assert not analysis._is_machinery(f"{where}/mpviz/scenarios/_common.py"), where
        assert not analysis._is_machinery(f"{where}/notebooks/programs/hang_join.py"), where


def test_a_stack_with_no_line_of_yours_shows_no_frame_of_mpviz():
    """A child with no line of the user's: on Python 3.13+ a Queue's feeder is joined at exit,
    from atexit, through the recorder's wrapper -- the verdict said "while exiting, it was in
    join() (threading.py:1134) ← _finalize_join() (queues.py:217) ← _recorded() (waits.py:68)".
    mpviz's own frames are never a verdict's words: the stdlib's frames say where it was."""
    from mpviz.trace import analysis
    for copy in (analysis._MPVIZ_DIR, "/src/mpviz/mpviz/"):       # this copy, and another
        stacks = (
            'Current thread 0x00007f (most recent call first):\n'
            '  File "/usr/lib/python3.14/threading.py", line 1134 in join\n'
            '  File "/usr/lib/python3.14/multiprocessing/queues.py", line 217 in _finalize_join\n'
            f'  File "{copy}trace/waits.py", line 68 in _recorded\n'
            '  File "/usr/lib/python3.14/multiprocessing/util.py", line 224 in __call__\n'
            '  File "/usr/lib/python3.14/multiprocessing/util.py", line 369 in _exit_function\n')
        said = analysis.user_line(stacks)
        assert "no line of yours" in said and "while exiting" in said, said
        assert "waits.py" not in said and "_recorded" not in said, said
        assert "join() (threading.py:1134) ← _finalize_join() (queues.py:217) ← __call__()" in said
