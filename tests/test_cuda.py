"""CUDA tensors and CUDA IPC's lifetime rules — one conformance suite for both backends.

Every test body runs once per backend: the simulator always, CuPy only where a GPU works (else it
is skipped, saying why). Consumers and producers are real processes under spawn. Where torch with
CUDA is installed too, the last tests run the same programs under torch.multiprocessing and compare
(section 6): the rules tested here are torch's as observed, not only as read in its source.
"""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import mpviz
import mpviz.cuda as cuda
from mpviz.cuda import backends
import mpviz.multiprocessing as mp
from mpviz.cuda import cupy_backend

import cuda_workers
from proc_helpers import finish, start

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEEDS = os.path.join(os.path.dirname(__file__), "seed_examples")
WARNING = "terminated before all shared CUDA tensors released"
_GPU_PROBLEM = cupy_backend.probe()


@pytest.fixture(scope="module")
def driver_files():
    """Let the CUDA driver open the files it keeps for the life of a process, before any leak check.

    The first context opens the device nodes (/dev/nvidia*), an eventfd and two pipes; the first
    interprocess event opens /dev/shm/cuda.shm.*. They stay open until the process exits (as in any
    CUDA program), so the per-test leak check must find them open already and count only ours.
    Module scope: pytest sets this up before the per-test leak check takes its snapshot.
    """
    if _GPU_PROBLEM is None:
        block = cupy_backend.allocate(1, 0)
        cupy_backend.record_event(block)
        block.export()
        block.free()


@pytest.fixture(params=["simulator", "cupy"])
def backend(request, driver_files):
    """Run the body on this backend (and make spawned children use it too)."""
    if request.param == "cupy" and _GPU_PROBLEM is not None:
        pytest.skip(f"no GPU backend here: {_GPU_PROBLEM}")
    old = os.environ.get(cuda._ENV_BACKEND)
    cuda._select(request.param)
    yield request.param
    cuda.ipc_collect()
    if old is None:
        os.environ.pop(cuda._ENV_BACKEND, None)
    else:
        os.environ[cuda._ENV_BACKEND] = old
    backends.forget()                    # choose again, from the environment


@pytest.fixture
def spawn():
    return mp.get_context("spawn")


def blocks(kind="allocated"):
    return {b["block"]: b for b in cuda.memory_stats()[kind]}


# -- 1. the backend, chosen once -------------------------------------------------------------------

def test_backend_choice(backend):
    assert cuda.backend() == backend
    assert cuda.is_available() is (backend == "cupy")
    assert cuda.device_count() >= 1
    assert (cuda.why_simulator() is None) is (backend == "cupy")


def test_simulator_says_so_once_on_first_cuda():
    code = ("import mpviz; a = mpviz.ones(2).cuda(); b = mpviz.zeros(3).to('cuda'); "
            "print(a.device, b.device)")
    env = dict(os.environ, MPVIZ_CUDA_BACKEND="simulator", PYTHONPATH=ROOT)
    env.pop("MPVIZ_CUDA_SIMULATOR_NOTICE", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cuda:0", "cuda:0"]
    notices = [line for line in r.stderr.splitlines() if "simulator" in line]
    assert len(notices) == 1 and "no GPU" in notices[0], r.stderr


# -- 2. the tensor side ------------------------------------------------------------------------------

def test_cuda_cpu_to_device_and_sharing_is_a_no_op(backend):
    t = mpviz.arange(12.0).reshape(3, 4)
    c = t.cuda()
    assert c.is_cuda and c.device == "cuda:0" and not t.is_cuda and t.device == "cpu"
    assert t.to("cuda").is_cuda and c.to("cpu").device == "cpu"
    assert c.is_shared() and c.share_memory_() is c and c.untyped_storage().location == "cuda"
    assert c.cpu().tolist() == t.tolist() and np.array_equal(np.asarray(c), t.numpy())
    v = c[1:, ::2]
    assert v.is_cuda and v.untyped_storage() is c.untyped_storage() and v.cpu().tolist() == [[4, 6], [8, 10]]
    assert (c + 1).is_cuda and c.clone().untyped_storage() is not c.untyped_storage()
    with pytest.raises(TypeError, match="cpu"):
        c.numpy()


# Each entry: what a program does with a tensor `a` (and `b`); run on CPU tensors and on CUDA ones.
CUDA_OPS = {
    "arithmetic": lambda a, b: (a + b) * 2 - a / (b.abs() + 1),
    "with a number": lambda a, b: 1 - a ** 2,
    "matmul": lambda a, b: a @ b.t(),
    "reductions": lambda a, b: mpviz.stack([a.sum(), a.mean(), a.max(), a.min()]),
    "reduce a dim": lambda a, b: a.sum(1) + a.max(0)[0][:1],
    "unary": lambda a, b: a.exp() + a.tanh() + a.relu() + a.sigmoid(),
    "views": lambda a, b: a.t()[1:, ::2].reshape(-1),
    "contiguous copy": lambda a, b: a.t().contiguous().view(-1),
    "advanced indexing": lambda a, b: a[[0, 2]],
    "item and tolist": lambda a, b: mpviz.tensor([a[1, 2].item(), a.sum().item()] + a[0].tolist(),
                                                 device=a.device),
}


def _in_place(a, b):
    a = a.clone()
    a[0] = 5.0                   # a number
    a[1, 1:] = b[1, 1:]          # a tensor on the same device
    a.mul_(2).add_(1)
    a[2].fill_(-1)
    a[:, 0].copy_(b[:, 1])
    return a


CUDA_OPS["in place"] = _in_place


@pytest.mark.parametrize("op", sorted(CUDA_OPS))
def test_tensor_ops_on_cuda_give_the_cpu_answers(backend, op):
    """What NumPy computes on the host, CuPy must compute on the device (all passed on an H100,
    before ``a.min()`` joined "reductions": that one has run on the simulator only).

    The simulator's device memory is NumPy underneath, so its half checks the moves to and from
    the device; the CuPy half checks CuPy's own arithmetic and views too: a view that was a copy
    (fixed) was found on a GPU."""
    a = mpviz.tensor(np.arange(12.0).reshape(3, 4) - 5)
    b = mpviz.tensor(np.linspace(-1, 1, 12).reshape(3, 4))
    want = CUDA_OPS[op](a, b)
    got = CUDA_OPS[op](a.cuda(), b.cuda())
    assert got.is_cuda and got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-6)


def test_a_cuda_storage_alone_is_not_sent_and_plain_pickle_copies(backend):
    from multiprocessing.reduction import ForkingPickler
    c = mpviz.ones(3).cuda()
    with pytest.raises(RuntimeError, match="Cannot pickle CUDA storage"):
        ForkingPickler.dumps(c.untyped_storage())
    back = pickle.loads(pickle.dumps(c))
    assert back.is_cuda and back.untyped_storage() is not c.untyped_storage() and back.tolist() == [1, 1, 1]


# -- 3. the rules -----------------------------------------------------------------------------------

def test_sent_block_waits_in_limbo_until_the_consumer_releases_it(backend, spawn):
    """Rule: the producer keeps a sent block until every consumer released it; `del` early frees."""
    q, out, release = spawn.Queue(), spawn.Queue(), spawn.Event()
    with mpviz.trace.record() as trace:
        x = mpviz.full((4, 4), 2.0).cuda()
        name = x.untyped_storage().block
        q.put(x)
        assert blocks()[name]["refcount"] == 1                  # a handle in flight
        p = start(spawn, cuda_workers.consume, q, out, release)
        got = out.get(timeout=30)
        assert got[:4] == ("got", True, "cuda:0", 32.0)
        assert got[4]["block"] == name and got[4]["refcount"] == 1 and got[4]["valid"]
        del x                                                   # the producer's code lets go...
        assert blocks()[name]["state"] == "limbo"               # ...but a consumer holds it
        assert cuda.ipc_collect() == 0 and name in blocks()
        release.set()                                           # the consumer: del x
        assert out.get(timeout=30) == ("released", [])
        assert blocks()[name]["refcount"] == 0
        assert cuda.ipc_collect() == 1 and name not in blocks()  # now it is freed
        finish(p)
    kinds = [(e.kind, e.pid) for e in trace.events if e.kind.startswith("cuda.") and e.args.get("block") == name]
    me = os.getpid()
    assert kinds == [("cuda.alloc", me), ("cuda.send", me), ("cuda.ipc_open", p.pid),
                     ("cuda.limbo", me), ("cuda.ipc_close", p.pid), ("cuda.free", me)], kinds


def test_a_failed_send_of_a_cuda_tensor_counts_no_consumer(backend):
    """A message that fails to pickle half-way (``(x, lambda: 0)``) made a handle and counted a
    consumer that will never come: it gives the count back, so ``del x`` frees the block at once
    (no limbo, no warning at exit)."""
    a, b = mp.get_context("fork").Pipe()
    try:
        x = mpviz.full((4,), 3.0).cuda()
        name = x.untyped_storage().block
        for _ in range(10):
            with pytest.raises(Exception):
                a.send((x, lambda: 0))
        assert (blocks()[name]["refcount"], blocks()[name]["sends"]) == (0, 0)
        del x
        assert name not in blocks()                     # freed, not parked in limbo
    finally:
        a.close()
        b.close()


def test_release_late_keeps_producer_memory_until_the_consumer_exits(backend, spawn):
    q, out, exit_now = spawn.Queue(), spawn.Queue(), spawn.Event()
    x = mpviz.ones(8).cuda()
    name = x.untyped_storage().block
    q.put(x)
    p = start(spawn, cuda_workers.consume_and_keep, q, out, exit_now)
    assert out.get(timeout=30)[:2] == ("got", 8.0)
    del x
    assert blocks()[name]["state"] == "limbo" and cuda.memory_stats()["held_for_consumers_bytes"] == 32
    assert cuda.ipc_collect() == 0
    exit_now.set()
    finish(p)                                   # the consumer's exit gives its count back
    assert blocks()[name]["refcount"] == 0 and cuda.ipc_collect() == 1 and not blocks()


@pytest.mark.parametrize("dtype, poison", [("float32", "nan"), ("int64", -1)])
def test_producer_exit_warns_and_the_consumer_reads_poison(backend, spawn, capfd, dtype, poison):
    q, got = spawn.Queue(), spawn.Event()
    p = start(spawn, cuda_workers.produce, q, got, dtype)
    y = q.get(timeout=30)
    assert y.cpu().tolist() == [[1] * 4] * 4 and cuda.ipc_info(y)["valid"]
    got.set()
    finish(p)                                   # it exits while we still hold its block
    assert WARNING in capfd.readouterr().err
    if backend == "simulator":                  # the use-after-free is visible, not silent
        info = cuda.ipc_info(y)
        assert info["valid"] is False and info["producer_alive"] is False
        values = y.cpu().numpy()
        assert np.isnan(values).all() if poison == "nan" else (values == poison).all()
    del y


def test_producer_that_waits_on_an_event_prints_nothing(backend, spawn, capfd):
    q, out, release, done = spawn.Queue(), spawn.Queue(), spawn.Event(), spawn.Event()
    producer = start(spawn, cuda_workers.produce_and_wait, q, done)
    consumer = start(spawn, cuda_workers.consume, q, out, release, done)
    assert out.get(timeout=30)[:4] == ("got", True, "cuda:0", 16.0)
    release.set()
    assert out.get(timeout=30) == ("released", [])
    done.set()
    finish(producer, consumer)
    assert WARNING not in capfd.readouterr().err


def test_resending_a_received_tensor_is_refused_and_its_clone_travels(backend, spawn):
    q, q2, out, done = spawn.Queue(), spawn.Queue(), spawn.Queue(), spawn.Event()
    x = mpviz.arange(5.0).cuda()
    q.put(x)
    p = start(spawn, cuda_workers.relay, q, q2, out, done)
    refused = out.get(timeout=30)
    assert refused[:2] == ("refused", "CudaResendError")
    assert "Attempted to send CUDA tensor received from another process" in refused[2]
    assert "clone()" in refused[2]
    y = q2.get(timeout=30)
    assert y.cpu().tolist() == [0, 1, 2, 3, 4]
    assert cuda.ipc_info(y)["producer"] == p.pid   # the clone belongs to the relay
    del y
    done.set()
    finish(p)
    assert blocks()[x.untyped_storage().block]["refcount"] == 0


def test_put_and_get_on_one_queue_in_one_process_raises(backend, spawn):
    out = spawn.Queue()
    p = start(spawn, cuda_workers.same_queue, out)
    kind, message = out.get(timeout=30)
    assert kind == "CudaSameProcessError" and "two queues" in message
    stats = out.get(timeout=30)[1]
    assert [b["refcount"] for b in stats] == [0]  # the refused handle's count was given back
    finish(p)
    # and in this process too
    q = mp.Queue()
    t = mpviz.ones(2).cuda()
    q.put(t)
    with pytest.raises(cuda.CudaSameProcessError, match="keep using the tensor"):
        q.get(timeout=30)
    assert blocks()[t.untyped_storage().block]["refcount"] == 0


def test_received_twice_is_one_block_and_one_count(backend, spawn):
    """The receive cache: a second handle to a block held already is given back at once."""
    q, out = spawn.Queue(), spawn.Queue()
    x = mpviz.ones(4).cuda()
    name = x.untyped_storage().block
    q.put(x)
    q.put(x[1:])
    assert blocks()[name]["refcount"] == 2      # two handles in flight
    p = start(spawn, cuda_workers.consume_twice, q, out)
    assert out.get(timeout=30) == ("same storage", True, 1)
    finish(p)
    assert blocks()[name]["refcount"] == 0


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="fork is POSIX only")
def test_forked_child_of_a_cuda_process_cannot_use_cuda(backend):
    mpviz.ones(1).cuda()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = start(ctx, cuda_workers.cuda_in_child, out)
    kind, message = out.get(timeout=30)
    assert kind == "CudaForkError" and "spawn" in message
    finish(p)


# -- 4. the seed examples, run as scripts with only their imports changed --------------------------

def run_seed(name, timeout=50, **env):
    """Run seed example `name` (or the script at path `name`) as a program; its CompletedProcess."""
    return _finish_seed(_start_seed(name, **env), timeout)


def _start_seed(name, **env):
    env = dict(os.environ, PYTHONPATH=ROOT, **env)
    return subprocess.Popen([sys.executable, os.path.join(SEEDS, name)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_seed(proc, timeout=50):
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


SEED_PROGRAMS = ["cuda_bad_practice.py", "cuda_good_practices.py", "cuda_dont_pass_received.py"]


@pytest.fixture(scope="module")
def seed_runs():
    """``seed_runs(backend)[name]``: the CompletedProcess of each of SEED_PROGRAMS run on that
    backend. The three programs (mostly the seed's own sleeps) run side by side, once per
    backend, and have all exited before the first test looks at one."""
    done = {}

    def runs(backend):
        if backend not in done:
            started = {name: _start_seed(name, MPVIZ_CUDA_BACKEND=backend) for name in SEED_PROGRAMS}
            done[backend] = {name: _finish_seed(proc) for name, proc in started.items()}
        return done[backend]
    return runs


def test_seed_bad_practice_prints_the_warning(backend, seed_runs):
    r = seed_runs(backend)["cuda_bad_practice.py"]
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Received mpviz.Size([20, 20])", r.stderr
    assert "Producer process has been terminated before all shared CUDA tensors released. " \
           "See Note [Sharing CUDA tensors]" in r.stderr


def test_seed_good_practices_print_no_warning(backend, seed_runs):
    r = seed_runs(backend)["cuda_good_practices.py"]
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Received mpviz.Size([20, 20]), all finite: True"
    assert WARNING not in r.stderr


def test_seed_dont_pass_received_tensors(backend, seed_runs):
    r = seed_runs(backend)["cuda_dont_pass_received.py"]
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("refused: Attempted to send CUDA tensor received from another "
                               "process; this is not currently supported. Consider cloning before sending.")
    assert lines[1] == "clone arrived: [1.0, 1.0, 1.0, 1.0, 1.0]"
    assert WARNING not in r.stderr


# -- 6. the oracle: the same program under torch on a real GPU ---------------------------------------

@pytest.fixture(scope="module")
def torch_on_a_gpu():
    """Skip unless CuPy and torch can both use a GPU here. torch is asked once, in a subprocess,
    so that importing it does not touch this test process."""
    if _GPU_PROBLEM is not None:
        pytest.skip(f"no GPU backend here: {_GPU_PROBLEM}")
    code = "import torch; print(torch.cuda.is_available())"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.skip("no torch oracle here: importing torch took over 120 s")
    if r.returncode != 0:
        pytest.skip(f"no torch oracle here: torch is not importable: {r.stderr.strip().splitlines()[-1:]}")
    if r.stdout.strip() != "True":
        pytest.skip("no torch oracle here: torch is installed but sees no GPU")


def _oracle(name, case):
    env = dict(os.environ, PYTHONPATH=ROOT, MPVIZ_CUDA_BACKEND="cupy")  # torch ignores the last
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "cuda_oracle.py"), name, case],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{name}: {r.stderr}"
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


@pytest.mark.gpu
@pytest.mark.timeout(600)   # the torch check + up to four 60 s runs
def test_cuda_ipc_rules_match_torch_on_a_gpu(torch_on_a_gpu):
    """The rules this module tests, checked against torch.multiprocessing itself on a real GPU."""
    ours, our_err = _oracle("mpviz", "rules")
    theirs, their_err = _oracle("torch", "rules")
    for key in ("storage_alone", "resend"):    # mpviz's messages begin with torch's, then explain
        assert ours[key].startswith(theirs.pop(key)), (key, ours[key])
        del ours[key]
    assert ours == theirs
    assert theirs == {"clone": [7.0] * 4, "exitcode": 0, "same_block": 4,
                      "shared": [True, True], "writes_back": [7.0] * 4}
    assert WARNING not in our_err and WARNING not in their_err
    for name in ("mpviz", "torch"):
        facts, err = _oracle(name, "producer-exits")
        assert facts == {"exitcodes": [0, 0]} and WARNING in err, (name, err)


@pytest.mark.gpu
@pytest.mark.timeout(600)   # the torch check + up to four 60 s runs
@pytest.mark.parametrize("seed", ["cuda_bad_practice.py", "cuda_good_practices.py",
                                  "cuda_dont_pass_received.py"])
def test_seed_prints_what_torch_prints_on_a_gpu(seed, tmp_path, torch_on_a_gpu):
    """Each CUDA seed example, run with torch's imports put back, prints what it prints under mpviz.

    Three differences are by design and checked as such:
    * mpviz's Queue.put pickles in the caller, so a refused tensor raises there ("refused: …" is
      printed by the seed); torch's feeder thread prints the same message on stderr and drops the
      item.
    * The bad-practice seed races under torch (its warning appeared in 1 of 4 runs on an H100: the
      producer sleeps 2 s instead of waiting for the consumer); mpviz always warns, as the seed's
      text shows. tests/cuda_oracle.py's producer-exits case checks torch's warning without the race.
    * In the dont-pass-received seed the main process is the producer and still holds its tensor
      when it exits, after the consumer has let go and exited: torch 2.11 warns then anyway (a false
      alarm, see mpviz/cuda/ipc.py rule 3); mpviz does not. The good-practices seed: neither warns.
    """
    ours_imports = "import mpviz as torch\nimport mpviz.multiprocessing as mp\n"
    source = open(os.path.join(SEEDS, seed)).read()
    assert ours_imports in source
    as_torch = tmp_path / seed
    as_torch.write_text(source.replace(ours_imports, "import torch\nimport torch.multiprocessing as mp\n"))
    ours, theirs = [run_seed(path, timeout=120, MPVIZ_CUDA_BACKEND="cupy")
                    for path in (seed, str(as_torch))]
    assert ours.returncode == theirs.returncode == 0, (ours.stderr, theirs.stderr)
    our_lines = ours.stdout.splitlines()
    for line in our_lines:
        if line.startswith("refused: "):
            torch_says = line[len("refused: "):].split(" (mpviz:")[0]
            assert f"RuntimeError: {torch_says}" in theirs.stderr, (line, theirs.stderr)
    assert [line for line in our_lines if not line.startswith("refused: ")] == \
        theirs.stdout.replace("torch.Size", "mpviz.Size").splitlines()
    if seed == "cuda_good_practices.py":
        assert WARNING not in theirs.stderr, theirs.stderr
    if seed != "cuda_bad_practice.py":
        assert WARNING not in ours.stderr, ours.stderr
