"""Every code example of the source documents runs under mpviz with only its imports changed.

The examples are in ``tests/seed_examples/`` (each file says which seed and section it is from,
and what besides the imports had to change: only typos that break it under torch too). Each runs
as a script in its own interpreter, all at once (most of their time is the tutorial's sleeps), and
is checked against what the seed's text says it prints and how long it takes. The CUDA examples
are checked in tests/test_cuda.py, the Hogwild example in tests/test_hogwild.py.
"""
import multiprocessing
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seed_examples")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# file -> (lines the text says it prints, in order; (min, max) seconds; what stderr must contain)
EXPECTED = {
    "tutorial_process.py": (["foo(1)"], (2, 8), None),
    "tutorial_queue.py": (["Putting 1 in queue", "Got 1 from queue"], (0, 6), None),
    "tutorial_pool_apply.py": (["3 7"], (6, 12), None),
    "tutorial_pool_apply_async.py": (["3 7"], (3, 8), None),
    "tutorial_pool_callback.py": ([{"Got result: 3", "Got result: 7"}], (3, 8), "PendingTasksWarning"),
    "tutorial_pool_queued.py": ([], (6, 12), "PendingTasksWarning"),
    # 10 items, 2 workers, default chunksize 2: 12 s ("which is sub-optimal")
    "tutorial_pool_map.py": ([{f"Starting foo({i})" for i in range(10)}, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"], (12, 18), None),
    "tutorial_pool_map_async.py": ([{f"Starting foo({i})" for i in range(10)}, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"], (12, 18), None),
    "tutorial_torch_pool_map.py": ([{f"Starting foo({i})" for i in range(10)}, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"], (12, 18), None),
    # The text says 6.0 s; 3 tasks of 2 s on 2 workers take 4 s (two rounds), with torch too.
    "tutorial_pool_starmap.py": ([{"Starting bar(1, 2)", "Starting bar(3, 4)", "Starting bar(5, 6)"}], (4, 9), None),
    "tutorial_is_shared.py": (["False", "True"], (0, 6), None),
    # The provider exits before the second get: the consumer's get fails (torch: ConnectionRefusedError).
    "tutorial_producer_exits.py": (["Received mpviz.Size([20, 20])"], (4, 12), "ProducerExitedError"),
    "tutorial_spawn_processes.py": ([], (0, 8), None),
    "tutorial_spawn.py": ([], (0, 10), None),
}


# Python 3.14 made forkserver the default start method on Linux (up to 3.13: fork), and a
# forkserver child runs the script again to find its functions. The tutorial's short examples
# start processes at module level, without a main guard: there they are refused before any child
# starts -- MissingMainGuardError, which names the RuntimeError the stdlib raises in the child
# (the stdlib fails them too, less clearly). What the tutorial says they print holds under fork.
DEFAULT_START = multiprocessing.get_all_start_methods()[0]     # (the first is the default)


def unguarded(name):
    """True for an example that starts processes from module-level code without a main guard."""
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        text = f.read()
    return "__main__" not in text and ("Process(" in text or "Pool(" in text)


def _run(name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               PYTHONUNBUFFERED="1")
    start = time.monotonic()
    out = subprocess.run([sys.executable, os.path.join(HERE, name)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=HERE)
    return out, time.monotonic() - start


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(len(EXPECTED)) as pool:
        return dict(zip(EXPECTED, pool.map(_run, EXPECTED)))


def test_every_tutorial_example_has_an_expectation():
    assert sorted(f for f in os.listdir(HERE) if f.startswith("tutorial_")) == sorted(EXPECTED)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_seed_example(runs, name):
    (out, seconds), (lines, (low, high), stderr_has) = runs[name], EXPECTED[name]
    if DEFAULT_START != "fork" and unguarded(name):
        assert out.returncode == 1, out.stderr
        assert "MissingMainGuardError" in out.stderr and "raises RuntimeError there" in out.stderr
        assert "if __name__ == '__main__':" in out.stderr
        return
    if stderr_has == "ProducerExitedError":
        assert out.returncode == 0, out.stderr   # the parent goes on; the consumer process fails
        assert "Process Process-2:" in out.stderr and "ProducerExitedError" in out.stderr
        assert "ConnectionRefusedError" in out.stderr or "has exited" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        if stderr_has:
            assert stderr_has in out.stderr
        else:
            assert "Traceback" not in out.stderr, out.stderr
    # Workers of one Pool write to one pipe, so their lines may interleave mid-line: look for
    # each expected text in order (a set: in any order among themselves), and for nothing else.
    text, pos, rest = out.stdout, 0, out.stdout
    for expected in lines:
        group = expected if isinstance(expected, set) else {expected}
        found = {item: text.find(item, pos) for item in group}
        missing = [item for item, at in found.items() if at < 0]
        assert not missing, f"{name} printed {text!r}: {missing} missing or out of order"
        pos = max(at + len(item) for item, at in found.items())
        for item in group:
            rest = rest.replace(item, "", 1)
    assert not rest.strip(), f"{name} printed more than the text says: {rest!r}"
    assert low - 0.2 <= seconds <= high + 10, f"{name} took {seconds:.1f} s; the text implies {low}"
