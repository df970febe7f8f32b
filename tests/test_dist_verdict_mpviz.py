"""The distributed verdicts on mpviz.distributed: the torch programs of tests/dist_programs/ with
one line changed -- ``import torch.distributed as dist`` becomes
``import mpviz.distributed as dist``, as the README tells a learner -- traced by ``python -m mpviz trace``; each must get the verdict
(class and words) its torch run gets in tests/test_trace_distributed.py, with the library named.

One difference is on purpose: ranks that disagree at a collective HANG under gloo (each waits in
its own collective) but FAIL under mpviz.distributed, whose start message carries each rank's
call: both ranks raise at once. The verdict's sentence names the same ranks and calls.
"""
import importlib.util
import os
import re
import socket
import subprocess
import sys

import pytest

from test_trace_distributed import PROGRAMS, ROOT, _free_port
from test_trace_merge import finish

SETUP_TIMEOUT = 240
TORCH, MPVIZ = "(torch.distributed)", "(mpviz.distributed)"

# Each program's verdict as tests/test_trace_distributed.py asserts it on torch's gloo.
SAME = {
    "rank_raises.py": (1, "mpviz trace: FAILED (torch.distributed) -- rank 1 raised ValueError: "
                          "sample 1 of rank 1 is corrupt after collective #1 (exit code 1), "
                          "without calling all_reduce #2: rank 0 waited in all_reduce #2, which "
                          "could never complete."),
    "only_rank0.py": (1, "mpviz trace: FAILED (torch.distributed) -- rank 1 called "
                         "destroy_process_group() after collective #1 and exited with code 0, "
                         "without calling all_reduce #2: rank 0 waited in all_reduce #2, which "
                         "could never complete."),
    "wrong_world_size.py": (124, "mpviz trace: HANG: STALLED (torch.distributed) -- waiting for "
                                 "3 ranks at the rendezvous; 2 arrived (ranks 0 and 1)."),
    "straggler.py": (124, "mpviz trace: HANG: STALLED (torch.distributed) -- rank 1 is slow, the "
                          "others wait for it in all_reduce #2: rank 0 waits in all_reduce #2."),
    "send_wrong_dst.py": (1, "mpviz trace: FAILED (torch.distributed) -- rank 0 exited with code "
                             "0, without calling send #1 to rank 2: rank 2 waited in recv #1 "
                             "from rank 0, which could never complete."),
}
FIXES = {"rank_raises.py": "Fix: read the traceback of the rank that failed",
         "only_rank0.py": "call it on every rank, and use its result on rank 0 only",
         "wrong_world_size.py": "rank 2 never arrived: no process of the program called "
                                "init_process_group as rank 2 (world_size is 3; 2 processes did).",
         "straggler.py": "in `time.sleep` (a deadline) -- at load_batch (straggler.py:14)",
         "send_wrong_dst.py": "rank 2's recv #1 from rank 0 has no send #1 to rank 2 -- check "
                              "the dst and src"}
DISAGREE = ("ranks 0 and 1 disagree at collective #3: rank 0 called all_reduce #3, rank 1 called "
            "barrier #3 (group [0, 1])")


def _on_mpviz(program, folder):
    """`program` with its one torch.distributed import changed to mpviz.distributed."""
    with open(os.path.join(PROGRAMS, program)) as f:
        text = f.read()
    changed = text.replace("import torch.distributed as dist\n",
                           "import mpviz.distributed as dist\n")
    assert changed != text, program
    folder.mkdir()
    path = folder / program
    path.write_text(changed)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{program: (returncode, stderr)}, every program traced at once."""
    if importlib.util.find_spec("torch") is None:   # (the 3.13/3.14 chroots)
        pytest.skip("the programs are torch programs (torch tensors, torch.multiprocessing) "
                    "with only their torch.distributed import changed: torch is not installed")
    held = socket.socket()                    # a port someone listens on
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    plan = {name: ([], _free_port()) for name in [*SAME, "uneven_batches.py",
                                                  "grad_average_shards.py",
                                                  "relay_past_the_end.py"]}
    plan["ddp_demo_basic.py"] = ([], port)                 # MASTER_PORT in use
    plan["tcp_init_method.py"] = ([str(port)], _free_port())   # its tcp:// port in use
    started = {}
    try:
        for name, (args, master_port) in plan.items():
            tmp = tmp_path_factory.mktemp(name.split(".")[0])
            env = dict(os.environ, PYTHONPATH=ROOT, MASTER_PORT=str(master_port),
                       GLOO_TIMEOUT="90", SLOW_LOAD="600")
            started[name] = subprocess.Popen(
                [sys.executable, "-m", "mpviz", "trace", "--hang-after", "2", "--no-plot", "-o",
                 str(tmp / "trace"), "--", sys.executable, str(_on_mpviz(name, tmp / "program")),
                 *args], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
        out = {name: finish(proc) for name, proc in started.items()}
    finally:
        held.close()
    out["port"] = port
    return out


@pytest.mark.timeout(SETUP_TIMEOUT)
@pytest.mark.parametrize("program", sorted(SAME))
def test_mpviz_distributed_gets_the_verdict_torchs_gloo_gets(runs, program):
    code, err = runs[program]
    torch_code, torch_words = SAME[program]
    assert code == torch_code, err
    words = torch_words.replace(TORCH, MPVIZ)
    if program == "only_rank0.py" and "(later it was killed by SIGTERM)" in err:
        # mpviz's rank 0 fails the moment rank 1 closes its connection (gloo's waits for its
        # timeout), so spawn's SIGTERM may reach rank 1 while it is still exiting: both are true
        words = words.replace(" and exited with code 0,", " (later it was killed by SIGTERM),")
    if program == "rank_raises.py" and "(later it was killed by SIGTERM)" in err:
        # (the same race: rank 0's error reached spawn first, and rank 1 was still exiting)
        words = words.replace(" (exit code 1),", " (later it was killed by SIGTERM),")
    assert words in err, err
    assert FIXES[program] in err, err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_ranks_that_disagree_fail_at_once_on_mpviz_with_the_words_of_glooss_hang(runs):
    code, err = runs["uneven_batches.py"]
    assert code == 1, err                      # (gloo: 124, a HANG: DEADLOCK -- see the top)
    assert f"mpviz trace: FAILED {MPVIZ} -- {DISAGREE}." in err, err
    assert "DistributedSampler pads the shards to equal length" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_an_all_reduce_of_another_size_fails_on_mpviz_with_the_sentence_gloo_gets(runs):
    code, err = runs["grad_average_shards.py"]
    assert code == 1, err     # (gloo: rank 1 completes it with a wrong result, rank 0 fails)
    assert (f"mpviz trace: FAILED {MPVIZ} -- ranks 0 and 1 disagree at collective #5: each "
            f"called all_reduce #5, with tensors of different sizes: rank 0 16 bytes, rank 1 4 "
            f"bytes (group [0, 1]).") in err, err
    assert "result is wrong" not in err          # (mpviz.distributed raised on both ranks)


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_port_in_use_gets_torchs_verdict_on_mpviz_too(runs):
    port = runs["port"]
    code, err = runs["ddp_demo_basic.py"]
    assert code == 1, err
    assert re.search(rf"mpviz trace: FAILED \(mpviz.distributed\) -- rank 0 \(SpawnProcess-\d, "
                     rf"pid \d+\) could not open the rendezvous: MASTER_PORT {port} is already "
                     rf"in use", err), err
    assert (f"mpviz.distributed said: DistNetworkError: The server socket has failed to listen "
            f"on any local network address. port: {port}") in err, err
    code, err = runs["tcp_init_method.py"]
    assert code == 1, err
    assert (f"could not open the rendezvous: port {port} (init_method tcp://127.0.0.1:{port}) "
            f"is already in use") in err, err
    assert "MASTER_PORT" not in err and "Fix: choose a free port (init_method=...)" in err


@pytest.mark.timeout(SETUP_TIMEOUT)
def test_a_rank_that_raised_an_mpviz_error_gets_one_fix_its_own(runs):
    code, err = runs["relay_past_the_end.py"]
    assert code == 1, err
    verdict = err[err.index("mpviz trace: FAILED"):err.index("mpviz trace: ", err.index(
        "mpviz trace: FAILED") + 1)]
    assert (f"mpviz trace: FAILED {MPVIZ} -- rank 1 raised ValueError: send: invalid dst rank "
            f"2: the group's ranks are [0, 1] before any collective (exit code 1), without "
            f"calling all_reduce #1: rank 0 waited in all_reduce #1") in verdict, verdict
    assert verdict.count("Fix") == 1, verdict        # (was two: the error's, then "read ...")
    assert ("  Fix (rank 1's error says it; its traceback is above): dst= one of them (a "
            "global rank); the others only waited for it.") in verdict, verdict
