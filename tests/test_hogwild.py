"""torch's Hogwild example, on mpviz, under every start method.

Four processes train one model whose parameters live in shared memory; each ``optimizer.step()``
writes straight into those bytes, so the parent's model learns. Under ``fork`` *without*
``share_memory()`` each child writes into its own copy-on-write copy, and the parent's model stays
exactly as it was — the line the example's NOTE is about.
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.examples import MyModel, accuracy, make_blobs, run_hogwild

pytestmark = pytest.mark.timeout(120)

TEST_SET = make_blobs(1000, seed=1)


def snapshot(model):
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def unchanged(model, before):
    return all(np.array_equal(p.detach().numpy(), before[name]) for name, p in model.named_parameters())


def test_hogwild_with_shared_parameters_learns(start_method):
    mpviz.manual_seed(0)
    model = MyModel()
    model.share_memory()
    before = accuracy(model, *TEST_SET)
    run_hogwild(model, num_processes=4, ctx=mp.get_context(start_method))
    after = accuracy(model, *TEST_SET)
    print(f"{start_method}: accuracy {before:.1%} -> {after:.1%}")
    assert after > 0.8, f"Hogwild under {start_method} reached only {after:.1%} (from {before:.1%})"


def test_under_fork_without_share_memory_the_parent_learns_nothing():
    mpviz.manual_seed(0)
    model = MyModel()                       # no model.share_memory()
    before = snapshot(model)
    run_hogwild(model, num_processes=4, ctx=mp.get_context("fork"))
    assert unchanged(model, before), "the children's updates should stay in their copy-on-write copies"
    assert not any(p.is_shared() for p in model.parameters())

    model.share_memory()                    # the same model, now shared: the children's steps land here
    run_hogwild(model, num_processes=4, ctx=mp.get_context("fork"))
    assert not unchanged(model, before)
    assert accuracy(model, *TEST_SET) > 0.8


@pytest.mark.parametrize("start_method", [m for m in mp.get_all_start_methods() if m != "fork"])
def test_under_spawn_sending_the_model_shares_it_anyway(start_method):
    # Process arguments are pickled under spawn/forkserver, and pickling a tensor moves its
    # storage into shared memory (in place): so the parent learns even without share_memory().
    mpviz.manual_seed(0)
    model = MyModel()
    run_hogwild(model, num_processes=2, ctx=mp.get_context(start_method))
    assert all(p.is_shared() for p in model.parameters())
    assert accuracy(model, *TEST_SET) > 0.8


def test_a_failing_worker_is_reported():
    model = MyModel()
    model.share_memory()
    with pytest.raises(RuntimeError, match=r"1 Hogwild worker\(s\) failed"):
        run_hogwild(model, num_processes=1, ctx=mp.get_context("fork"), batch_size=0)


def test_the_seed_example_runs_as_written():
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "mpviz.examples.hogwild"], capture_output=True,
                          text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr
    found = re.search(r"accuracy after 4 Hogwild workers: ([\d.]+)%", done.stdout)
    assert found, done.stdout
    assert float(found.group(1)) > 80.0, done.stdout
