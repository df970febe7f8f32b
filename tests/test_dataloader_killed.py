"""A DataLoader worker killed (SIGKILL) right after it put a batch, while the loop is still busy
with the batch before: the batch on its way comes from a dead worker. torch says its words; mpviz
must say the same, under both strategies -- not a file_descriptor fetch error in their place
(said before: "ProducerExitedError: process N sent shared memory ... but has exited before this
process received it", the whole error). Real torch beside mpviz, each in its own interpreter."""
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

PROGRAM = '''
"""A DataLoader whose worker is killed (SIGKILL: what the OOM killer sends) right after it put
a batch, while the training loop is still busy with the one before: the batch on its way
arrives from a dead worker. Run with torch or mpviz: python ... torch|mpviz [strategy]."""
import os
import signal
import sys
import time


class Samples:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 2:                                   # (batches 0 and 1 are put by now)
            os.kill(os.getpid(), signal.SIGKILL)
        return [float(i)] * 4


if __name__ == "__main__":
    if sys.argv[1] == "torch":
        import torch
        from torch.utils.data import DataLoader
        mp = torch.multiprocessing
    else:
        import mpviz.multiprocessing as mp
        from mpviz.utils.data import DataLoader
    if len(sys.argv) > 2:
        mp.set_sharing_strategy(sys.argv[2])
    for batch in DataLoader(Samples(), batch_size=1, num_workers=1):
        time.sleep(1)                                # the training step
'''


def _errors(tmp_path, *args):
    path = tmp_path / "loader_worker_killed_mid_batch.py"
    path.write_text(PROGRAM)
    run = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                         timeout=90)
    assert run.returncode != 0, run.stderr
    lines = [line.strip() for line in run.stderr.splitlines()
             if re.match(r"[\w.]*(Error|Exception)\b", line)]
    return [re.sub(r"\d+", "N", line) for line in lines]


TORCHS = ["RuntimeError: DataLoader worker (pid N) is killed by signal: Killed.",
          "RuntimeError: DataLoader worker (pid(s) N) exited unexpectedly"]


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_a_batch_from_a_worker_killed_after_its_put_says_torchs_words(tmp_path, strategy):
    torch_said = _errors(tmp_path, "torch", strategy)
    # torch's SIGCHLD handler raises wherever the main thread is: in the loop's sleep only its
    # own line; in the wait for a batch, both
    assert torch_said[-1:] in ([TORCHS[0]], [TORCHS[1]]), torch_said
    ours = _errors(tmp_path, "mpviz", strategy)
    assert ours[-2:] == TORCHS, ours          # the last words are torch's, chained as torch's
