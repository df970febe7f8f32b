"""What the notebooks' text and the scenarios' verdicts claim, checked against what really runs.

A student believes what we write: a table that renders wrong, a sum that does not add up, an
exercise whose question does not match its picture, a claim about torch that torch does not
keep -- each is a bug. Each test here pins one claim that was once false.
"""
import json
import os
import re

import pytest

import mpviz.scenarios as sc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def markdown(notebook):
    """The markdown cells of `notebook` (a file name in notebooks/), as strings."""
    with open(os.path.join(NOTEBOOKS, notebook)) as f:
        cells = json.load(f)["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def table_blocks(text):
    """Each run of consecutive '|' lines in `text`, as a list of lines."""
    blocks, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    return blocks


ALL_NOTEBOOKS = sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS)
def test_every_markdown_table_has_its_header(notebook):
    # rows cut off from their table (under another heading) render as plain text with bars
    for text in markdown(notebook):
        for block in table_blocks(text):
            assert len(block) >= 2 and re.match(r"^\|\s*:?-{3,}", block[1]), (
                f"{notebook}: a table without a header and separator line: {block[0][:80]}")


def test_notebook_11s_table_has_all_eight_pitfalls_in_one_table():
    text = next(t for t in markdown("11_more_pitfalls.ipynb") if "in one table" in t)
    [table] = table_blocks(text)
    numbers = [row.split("|")[1].strip() for row in table[2:]]
    assert sorted(numbers, key=int) == ["2", "3", "4", "7", "9", "10", "13", "14"]


def test_sender_fds_verdict_adds_up_to_the_limit_with_the_fds_it_really_opens():
    # the verdict once said "18 fds at the start plus 28 kept tensors came to 48" (46)
    bad = sc.run("sender-fds")
    assert bad.outcome == "error", bad.explanation
    m = re.search(r"(\d+) \+ (\d+) \+ (\d+) = (\d+)", bad.explanation)
    assert m, bad.explanation
    start, other, kept, limit = map(int, m.groups())
    assert (start, kept, limit) == (bad.details["start_fds"], bad.details["sent"],
                                    bad.params["limit"])
    assert start + other + kept == limit
    # the "other" fds are real: a run under a roomy limit keeps all 100 tensors, and its peak
    # is start + 100 + exactly that many
    roomy = sc.run("sender-fds", limit=200)
    assert roomy.outcome == "ok", roomy.explanation
    assert roomy.details["peak_fds"] - roomy.details["start_fds"] - 100 == other


def test_autograd_fork_does_not_say_a_cpu_backward_is_safe_in_torch():
    # torch's engine (engine.cpp, start_device_threads) counts the GPUs the machine has, not the
    # ones the backward used: device='cpu' only plays a machine without a GPU. The texts once
    # said the mark needs "a GPU in use", which a student would take as "CPU backward is safe".
    cpu = sc.run("autograd-fork", device="cpu")
    assert cpu.outcome == "ok", cpu.explanation
    assert "machine without a GPU" in cpu.explanation
    assert "would have marked the child" in cpu.explanation
    assert "machine with a GPU" in sc.module("autograd-fork").SUMMARY
    nb = "\n".join(markdown("11_more_pitfalls.ipynb"))
    assert "with a GPU in use" not in nb
    with open(os.path.join(NOTEBOOKS, "solutions", "11_more_pitfalls.md")) as f:
        assert "is **not** safe" in f.read()


def test_small_shm_picture_question_counts_what_the_picture_shows():
    # the question once asked for "red 'copy 8 MiB' boxes", but the timeline labels copies that
    # sit close together as one group ('2 copies, 16 MiB'): a student counting that label got
    # it wrong. Counted as the question now says (each label names its number of copies), the
    # picture gives the run's number of copies.
    import matplotlib
    matplotlib.use("Agg")
    import mpviz.viz as viz
    from mpviz.exercises import nb11

    result = sc.run("small-shm")
    fig = viz.timeline(result.trace)
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    counted = 0
    for label in labels:
        m = re.fullmatch(r"(?:copy 8 MiB|(\d+) copies, (\d+) MiB)", label)
        if m:
            counted += int(m.group(1) or 1)
    copies = len(result.trace.of_kind("copy"))
    hidden = any("hidden" in t for t in labels)
    assert counted == copies or (hidden and counted < copies), (labels, copies)
    [question] = [e.question for e in nb11.EXERCISES if e.id == "11.picture-small-shm"]
    assert "'copy 8 MiB' boxes" not in question and "'2 copies, 16 MiB' is two" in question
    cell = next(t for t in markdown("11_more_pitfalls.ipynb") if "Exercise 2" in t)
    assert "**copy 8 MiB** boxes" not in cell and "2 copies, 16 MiB" in cell


def test_notebook_text_does_not_name_the_kernels_python_version():
    # "This kernel runs Python 3.11" is true on one machine; the project runs on 3.10 and later
    for notebook in ALL_NOTEBOOKS:
        for text in markdown(notebook):
            assert not re.search(r"kernel runs Python 3\.\d+", text), notebook


def _torch_grad_child(model, out):
    model(__import__("torch").ones(1, 3)).sum().backward()
    out.put(model.weight.grad.sum().item())


def test_torch_fork_child_given_the_model_shares_the_parents_grad():
    # notebook 02's solution once said that in PyTorch 2.x "the parent's p.grad never changes"
    # when a worker runs backward(); that holds for a pickled model, not for a forked child
    # given the model as an argument after model.share_memory() shared an existing grad
    torch = pytest.importorskip("torch")
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("fork")
    model = torch.nn.Linear(3, 1, bias=False)
    model(torch.ones(1, 3)).sum().backward()             # the parent's grad: 3
    model.share_memory()                                 # shares the existing grad too
    out = ctx.Queue()
    child = ctx.Process(target=_torch_grad_child, args=(model, out))
    child.start()
    assert out.get(timeout=60) == 6.0                    # the child added into the same grad
    child.join(60)
    assert model.weight.grad.sum().item() == 6.0         # and the parent sees it
    with open(os.path.join(NOTEBOOKS, "solutions", "02_sharing_tensors.md")) as f:
        text = f.read()
    assert "never changes. Under `fork`" in text or "Under `fork`, a\n   model" in text


TORCH_SENDER_OVER_ITS_LIMIT = '''
import resource
import torch, torch.multiprocessing as mp
q = mp.get_context("fork").Queue()
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
kept = []
for i in range(60):
    t = torch.zeros(4)
    q.put(t)                  # never raises: the feeder thread moves t into shared memory
    kept.append(t)
print("all 60 puts returned", flush=True)
q.close()
q.join_thread()               # the feeder has tried every tensor (and printed its refusals)
'''


def test_torch_queue_put_does_not_raise_when_the_sender_runs_out_of_fds():
    # sender-fds and notebook 11 once let a student believe torch raises at the put, as mpviz
    # does; torch's feeder thread prints the message and drops the tensor
    pytest.importorskip("torch")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", TORCH_SENDER_OVER_ITS_LIMIT],
                          capture_output=True, text=True, timeout=120)
    assert "all 60 puts returned" in done.stdout, done.stderr[-2000:]
    assert "in read-write mode: Too many open files (24)" in done.stderr
    assert "queues.py" in done.stderr and "_feed" in done.stderr      # from the feeder thread
    bad = sc.run("sender-fds")
    assert "but not at the put: its Queue's feeder thread prints it" in bad.explanation


def test_non_leaf_put_is_not_called_silent():
    # torch's feeder thread prints the refusal to stderr: the loss is not silent, only invisible
    # to the code that called put (the scenario shows the printed line in its output)
    assert "silent" not in sc.module("non-leaf-put").SUMMARY
    assert not any("silently goes missing" in t for t in markdown("02_sharing_tensors.ipynb"))
    theirs = sc.run("non-leaf-put", library="stdlib")
    assert theirs.details["put"] == "returned" and "Cowardly refusing" in theirs.output


TORCH_MANAGER_KEEPS_A_DEAD_CLIENTS_FILE = '''
import os, signal, time
import torch, torch.multiprocessing as mp
mp.set_sharing_strategy("file_system")

def child(q):
    t = torch.zeros(1000).share_memory_()               # kept: the child dies holding it
    q.put(t.untyped_storage()._share_filename_cpu_()[1])
    time.sleep(60)

if __name__ == "__main__":
    mine = torch.zeros(10).share_memory_()              # the parent is a client too
    q = mp.get_context("fork").Queue()
    c = mp.get_context("fork").Process(target=child, args=(q,))
    c.start()
    name = q.get(timeout=60)
    name = name.decode() if isinstance(name, bytes) else name
    os.kill(c.pid, signal.SIGKILL)
    c.join()
    time.sleep(4)                                       # the manager's timeout is 2 s
    print("left:", os.path.exists("/dev/shm" + name), flush=True)
'''


def test_torch_shm_manager_keeps_a_dead_clients_file_while_another_client_lives(tmp_path):
    # notebook 03 once said torch's manager removes what no live process holds, as mpviz's
    # does; torch's waits until all its clients have exited
    pytest.importorskip("torch")
    import subprocess
    import sys
    script = tmp_path / "manager.py"
    script.write_text(TORCH_MANAGER_KEEPS_A_DEAD_CLIENTS_FILE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert "left: True" in done.stdout, done.stdout + done.stderr[-2000:]
    text = "\n".join(markdown("03_sharing_strategies.ipynb"))
    assert "cleans up when all its\nclients are gone" in text


def sources(notebook, kind=None):
    """The cells' sources of `notebook` (markdown and code, or only `kind`), as strings."""
    with open(os.path.join(NOTEBOOKS, notebook)) as f:
        cells = json.load(f)["cells"]
    return ["".join(c["source"]) for c in cells if kind is None or c["cell_type"] == kind]


def test_every_count_of_the_scenarios_is_the_catalogs():
    # notebook 00's import line once said "18 runnable teaching cases" two cells above a
    # listing of 28
    total = len(sc.catalog())
    said = []
    for notebook in ALL_NOTEBOOKS:
        for text in sources(notebook):
            for m in re.finditer(r"(\d+) (?:runnable teaching cases|scenarios\b)", text):
                said.append((notebook, m.group(0)))
                assert int(m.group(1)) == total, (notebook, m.group(0), total)
    assert said, "no notebook counts the scenarios any more: drop this test"


TORCH_IS_SHARED_RIGHT_AFTER_PUT = '''
import torch, torch.multiprocessing as mp
q = mp.Queue()
seen = []
for _ in range(5):
    mat = torch.randn((200, 200))
    q.put(mat)
    seen.append(mat.is_shared())      # the tutorial's second print, right after the put
    q.get(timeout=60)
print("right after put:", seen.count(False), "False of", len(seen), flush=True)
'''


def test_torch_is_shared_right_after_queue_put_is_false():
    # notebook 00 once said torch's second print "can still print False if it runs within a
    # millisecond of the put", as if True were the rule; the feeder thread moves the storage
    # milliseconds after put returns, so the print right after it says False
    pytest.importorskip("torch")
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", TORCH_IS_SHARED_RIGHT_AFTER_PUT],
                          capture_output=True, text=True, timeout=120)
    m = re.search(r"right after put: (\d+) False of 5", done.stdout)
    assert m, done.stdout + done.stderr[-2000:]
    assert int(m.group(1)) >= 4, done.stdout
    text = "\n".join(markdown("00_overview.ipynb"))
    assert "within a millisecond" not in text
    assert "the second line prints `False`" in text


def test_notebook_00_legend_draws_every_colour_the_pictures_use():
    # "one colour, one meaning ... learn these and you can read all of them" once left out the
    # hatched box of every join and get ('blocked') and the lane colours; a student took the
    # light blue of a running main for the blue of a held lock
    import mpviz.viz as viz
    [cell] = [t for t in sources("00_overview.ipynb", "code") if "viz.legend(" in t]
    listed = re.search(r"viz\.legend\(ax, \[(.*?)\]", cell, re.S).group(1)
    keys = set(re.findall(r'"(\w+)"', listed))
    assert keys == set(viz.WORDS), set(viz.WORDS) ^ keys
    [text] = [t for t in markdown("00_overview.ipynb") if "One colour, one meaning" in t]
    for words in ("blocked in a wait", "still running when the recording ended",
                  "killed by a signal", "an error exit"):
        assert words in text, words


def test_notebook_02s_handle_is_as_small_as_its_text_says():
    # notebook 02 once called the handle on the green arrow "a few hundred bytes" while the
    # arrow's label said 173 B; the same cell's run, for a 64-byte and a 1 MiB tensor
    import mpviz
    import mpviz.multiprocessing as mp
    import mpviz.trace
    from mpviz.examples import notebook_workers as nw
    for numel in (16, 2**18):
        x = mpviz.zeros(numel)
        with mpviz.trace.record() as trace:
            q, results = mp.Queue(), mp.Queue()
            child = mp.Process(target=nw.receive_and_fill, args=(q, results, 7.0))
            child.start()
            q.put(x)
            results.get(timeout=60)
            child.join(60)
        q.close()
        results.close()
        [handle] = [f for f in trace.flows() if f.put.args.get("handles")]
        assert handle.nbytes < 200, (numel, handle.nbytes)
    [text] = [t for t in markdown("02_sharing_tensors.ipynb") if "The **green** arrow" in t]
    assert "few hundred bytes" not in text and "under 200 bytes" in text


def test_notebook_03_does_not_time_the_spawned_childrens_start():
    # notebook 03 once said "the first second is the two spawned children starting" under a
    # timeline whose put came at about 0.55 s (0.9 s in another run); what holds on every
    # machine: each child's lane starts (launch) well before its first event of its own
    # (bootstrap, after the fresh interpreter's imports), and the producer copies after that
    result = sc.run("producer-exits")
    events = result.trace.events
    launch = {e.args["child"]: e.ts_ns for e in events if e.kind == "process.launch"}
    boot = {e.pid: e.ts_ns for e in events if e.kind == "process.bootstrap"}
    assert set(boot) == set(launch) and len(boot) == 2
    assert all(boot[pid] - launch[pid] > 0.05e9 for pid in boot), (launch, boot)
    [producer] = [p.pid for p in result.trace.processes() if p.name == "producer"]
    assert boot[producer] < min(e.ts_ns for e in events if e.kind == "copy")
    [text] = [t for t in markdown("03_sharing_strategies.ipynb") if "compress_idle=False" in t
              and "What just happened" in t]
    assert "The first second" not in text
    assert "up to its first event, is that spawned child starting" in " ".join(text.split())


def copies_labelled(fig):
    """How many copies the red boxes' labels of a timeline name ('copy 64 KiB' is one)."""
    counted = 0
    for label in (t.get_text() for ax in fig.axes for t in ax.texts):
        m = re.fullmatch(r"(?:copy [\d.]+ [KMG]?i?B|(\d+) copies, [\d.]+ [KMG]?i?B)", label)
        if m:
            counted += int(m.group(1) or 1)
    return counted


def test_notebook_05_counts_copies_by_the_labels_not_by_boxes():
    # notebook 05 once said "one red copy box per batch, 24 in all" and "6 red boxes instead of
    # 24", under timelines where close copies overlap into fewer boxes (and its own exercise
    # says to read the labels); counted by the labels, the pictures give the runs' copies
    import matplotlib
    matplotlib.use("Agg")
    import mpviz.viz as viz
    for reuse, copies in ((False, 24), (True, 6)):
        result = sc.run("buffer-reuse", reuse=reuse)
        assert result.details["copies"] == copies
        assert len(result.trace.of_kind("copy")) == copies
        fig = viz.timeline(result.trace)
        labels = [t.get_text() for ax in fig.axes for t in ax.texts]
        counted = copies_labelled(fig)
        assert counted == copies or (any("hidden" in t for t in labels) and counted < copies)
    text = "\n".join(markdown("05_buffer_reuse.ipynb"))
    assert "red boxes instead of 24" not in text and "one red\n  `copy` box per batch" not in text
    assert "6 copies instead of 24" in text and "the label above them counts them" in text
    # and the green arrows of this file_descriptor run carry a handle, not "a name" (notebook
    # 03's lesson: under file_descriptor the name is gone at once, a descriptor is handed over)
    assert sc.run("buffer-reuse").params["strategy"] == "file_descriptor"
    assert "only a name travelled" not in text


def test_notebook_08_does_not_say_no_warning_under_a_warning_verdict():
    # notebook 08 once said "No error, no warning." right under the line where the trap's run
    # prints its verdict, WARNING; the warning is mpviz's, not torch's, and the text says so
    trap = sc.run("hogwild", share=False)
    assert trap.outcome == "warning", trap.explanation
    assert trap.details["parent_params_changed"] is False
    text = "\n".join(markdown("08_hogwild.ipynb"))
    assert "No error, no warning." not in text
    assert "the `WARNING` printed above is mpviz's verdict" in text


NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8,
                "ten": 10, "twenty": 20}


def test_notebook_09_says_how_many_schedules_its_cells_try():
    # notebook 09 once said "Try them all" above random_schedules(..., n=4): four random
    # schedules, not all of them. A cell that samples may not claim all; one that says how many
    # it tries at random must say its n
    with open(os.path.join(NOTEBOOKS, "09_be_the_scheduler.ipynb")) as f:
        cells = json.load(f)["cells"]
    before, checked = "", 0
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            before = text
            continue
        m = re.search(r"random_schedules\(.*n=(\d+)", text)
        if m:
            assert not re.search(r"them all|every schedule", before, re.I), before
            said = re.search(r"Try (\w+) schedules at random", before)
            if said:
                assert NUMBER_WORDS[said.group(1)] == int(m.group(1)), (said.group(0), m.group(0))
                checked += 1
    assert checked >= 1


def test_notebook_04_times_its_watchdog_runs_as_the_watchdog_does():
    # notebook 04 once said the stdlib notebook-function run takes "about 8 s"; its watchdog
    # calls a run stuck after STALL_SECONDS (3 s) without progress, and the run took about 5 s
    from mpviz.scenarios import fork_held_lock, notebook_function
    text = " ".join("\n".join(markdown("04_fork_deadlocks.ipynb")).split())
    assert f"about {fork_held_lock.STALL_SECONDS:g} s without any new event" in text
    stall = notebook_function.STALL_SECONDS
    m = re.search(r"under the watchdog \(about (\d+) s: the spawned workers' start, then "
                  r"(\d+) s without progress", text)
    assert m, "the notebook-function run's time is no longer given as expected"
    said, stall_said = int(m.group(1)), int(m.group(2))
    assert stall_said == stall
    hang = sc.run("notebook-function", library="stdlib")
    assert hang.outcome == "deadlock", hang.explanation
    assert stall < said < stall + 4, said              # the workers' start takes a second or two
    assert hang.duration_s < 2 * said, (said, hang.duration_s)      # measured: 4.9 s and 5.2 s


def test_scenario_docstrings_match_their_runs():
    # four scenario docstrings once said what their runs do not show: queue-sharing's handle
    # "a few hundred bytes" (163 B), too-many-fds's consumer "limit 64" (its default is 48),
    # hogwild's untrained parent "at chance" (41.5% with 4 classes, before and after), and
    # fs-leak's manager "like torch's" (torch's waits for all its clients to exit)
    shared = sc.run("queue-sharing")
    handles = [f.nbytes for f in shared.trace.flows() if f.put.args.get("handles")]
    assert handles and max(handles) < 200, handles
    doc = sc.module("queue-sharing").__doc__
    assert "few hundred bytes" not in doc and "under 200 bytes" in doc

    fds = sc.module("too-many-fds")
    [said] = re.findall(r"consumer \(limit (\d+)\)", fds.__doc__)
    assert int(said) == fds.PARAMS["limit"].default

    trap = sc.run("hogwild", share=False)
    assert trap.details["accuracy_after"] == trap.details["accuracy_before"] > 0.3
    doc = sc.module("hogwild").__doc__
    assert "chance" not in doc and "stays where it was before training" in doc

    doc = " ".join(sc.module("fs-leak").__doc__.split())
    assert "like torch's" not in doc
    assert "it waits until all its clients have exited" in doc


def test_each_notebooks_exercises_come_in_its_solutions_order():
    # notebook 00 once asked "2 · Read the picture, 3 · Fix it" while its solutions answered
    # "2 · Fix it, 3 · Read the picture": a student reading answer 2 got the other exercise's
    for solution in sorted(os.listdir(os.path.join(NOTEBOOKS, "solutions"))):
        if not solution[:2].isdigit():
            continue
        notebook = solution.replace(".md", ".ipynb")
        asked = [m for text in sources(notebook, "code")
                 for m in re.findall(r'check\("([\w.-]+)"', text)
                 if ".play-" not in m]          # notebook 09's puzzles, checked where solved
        numbers = [int(n) for text in markdown(notebook)
                   for n in re.findall(r"^### (?:Exercise )?(\d) · ", text, re.M)]
        with open(os.path.join(NOTEBOOKS, "solutions", solution)) as f:
            # (notebook 10's exercises are checked by helpers, not check("id"): no id there)
            answered = re.findall(r"^## (?:Exercise )?(\d) · (?:.*\(`([\w.-]+)`\))?", f.read(),
                                  re.M)
        assert asked == [i for _, i in answered if i], (notebook, asked, answered)
        assert numbers == [int(n) for n, _ in answered] == list(range(1, len(answered) + 1))


def _flat(texts):
    return " ".join(" ".join(texts).split())


TORCH_JOIN_THEN_GET = """
import sys
import torch, torch.multiprocessing as mp
def child(q):
    q.put(torch.ones(2**18))          # 1 MiB: its handle fits in the pipe
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    p.join(30)                          # returns: the handle was written, the child exited
    print("joined", p.exitcode, flush=True)
    try:
        q.get(timeout=30)
        print("arrived")
    except Exception as exc:
        print(type(exc).__name__)
"""


def _run_torch(program, *args, timeout=120):
    import subprocess
    import sys
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_tensor_is_no_way_out_of_join_before_get():
    # notebook 04 once said "Tensors are immune" to join-before-get and the verdict said "send
    # large data as tensors": under file_descriptor the join returns, then get() must fetch the
    # fd from the exited child and fails, in torch and in mpviz
    # (which of two errors depends on a race in torch's child at exit: whether the socket file
    # of its fd server is already removed -- FileNotFoundError -- or still there with nobody
    # listening -- ConnectionRefusedError; a fresh-clone run saw the first once)
    said = _run_torch(TORCH_JOIN_THEN_GET).split()
    assert said[:2] == ["joined", "0"] and said[2:] in (["ConnectionRefusedError"],
                                                       ["FileNotFoundError"]), said
    import mpviz
    import mpviz.multiprocessing as mp
    from mpviz.errors import ProducerExitedError
    from mpviz.examples import notebook_workers as nw
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=nw.producer, args=(mpviz.ones(2**18), q))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    with pytest.raises(ProducerExitedError):
        q.get(timeout=30)
    q.close()
    from mpviz.scenarios import queue_join_deadlock as qjd
    said = qjd.verdict(None, {"stuck": True, "params": {"nbytes": 1 << 20}})[1]
    assert "as tensors" not in said and "ProducerExitedError" in said
    assert "immune" not in qjd.__doc__ and "no way out" in " ".join(qjd.__doc__.split())
    nb = _flat(markdown("04_fork_deadlocks.ipynb"))
    assert "immune" not in nb and "Is a tensor a way out?" in nb
    assert "join_then_get(real_torch" in "".join(sources("04_fork_deadlocks.ipynb", "code"))
    with open(os.path.join(NOTEBOOKS, "solutions", "04_fork_deadlocks.md")) as f:
        answer = " ".join(f.read().split())
    assert "no hang, but still broken" in answer and "ConnectionRefusedError" in answer


TORCH_GRAD = """
import torch, torch.multiprocessing as mp
from mpviz.examples import notebook_workers as nw
if __name__ == "__main__":
    a = torch.ones(3, requires_grad=True)
    (a * 2).sum().backward()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=nw.report_grad, args=(a, out))
    child.start()
    print("spawn-argument", out.get(timeout=60))
    child.join()
    out.put(a)
    print("queue", out.get(timeout=60).grad)
"""


def test_torch_drops_grad_and_every_text_that_shows_mpviz_sharing_it_says_so():
    # notebook 02 once called the docs' ".grad is also shared" true and said "mpviz does
    # exactly this", without saying that torch 2.13 drops .grad (through a Queue and as a
    # spawn argument); the notebook now runs real torch to show it
    assert _run_torch(TORCH_GRAD).split() == ["spawn-argument", "None", "queue", "None"]
    nb = _flat(markdown("02_sharing_tensors.ipynb"))
    assert "mpviz does exactly this" not in nb
    assert "Torch 2.13 drops `.grad`" in nb and "torch 2.13 drops it" in nb
    assert "nw.report_grad" in "".join(sources("02_sharing_tensors.ipynb", "code"))
    grads = sc.module("grad-sharing")
    assert "Torch 2.13 drops ``.grad``" in " ".join(grads.__doc__.split())
    said = grads.verdict(None, {"parent_a_grad": [5.0] * 4, "parent_b_grad_is_none": True})[1]
    assert "real torch 2.13 drops .grad" in said
    with open(os.path.join(NOTEBOOKS, "solutions", "02_sharing_tensors.md")) as f:
        assert "torch 2.13 drops `.grad`" in " ".join(f.read().split())


def test_receive_cache_is_said_what_it_is_where_it_is_first_used():
    # notebook 02 once used "receive cache" and notebook 05 defined it
    nb = _flat(markdown("02_sharing_tensors.ipynb"))
    first = nb.index("receive cache")
    assert "segment → storage" in nb[first:first + 80]


def test_notebook_04_reads_its_stacks_as_they_are_printed():
    # it once said "read the stacks from the bottom up" above stacks printed innermost first
    from mpviz.scenarios.runner import _stack_summary
    nb = _flat(markdown("04_fork_deadlocks.ipynb"))
    assert "bottom up" not in nb and "the innermost call comes first" in nb
    assert '`<-` means "called from"' in nb
    # faulthandler prints the innermost frame first; the summary keeps that order
    stack = ('Thread 0x00007f (most recent call first):\n'
             '  File "/x/inner.py", line 2 in inner\n'
             '  File "/x/outer.py", line 1 in outer\n')
    summary = _stack_summary({7: {"name": "child", "stacks": stack}})
    assert summary.index("inner (inner.py:2)") < summary.index("outer (outer.py:1)"), summary


TORCH_FDS = """
import os, sys, torch, torch.multiprocessing as mp
def child(q, out):
    before = len(os.listdir("/proc/self/fd"))
    kept = [q.get() for _ in range(8)]
    out.put(len(os.listdir("/proc/self/fd")) - before)
    q.get()
if __name__ == "__main__":
    mp.set_sharing_strategy(sys.argv[1])
    ctx = mp.get_context("fork")
    q, out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, out))
    p.start()
    ts = [torch.zeros(256 * 1024) for _ in range(8)]
    for t in ts:
        q.put(t)
    print(out.get(timeout=60))
    q.put(None)
    p.join()
"""


def test_notebook_03_counts_the_childs_fds_for_mpviz_and_for_torch():
    # it once said "(9 = 8 tensors + 1 connection)" as if torch did the same: torch's child
    # has 8 (a connection per fd, closed), mpviz's 9 (one connection kept to the sender)
    assert int(_run_torch(TORCH_FDS, "file_descriptor")) == 8
    assert int(_run_torch(TORCH_FDS, "file_system")) == 1
    fd_run = sc.run("strategies")
    assert fd_run.details["child_extra_fds"] == 9
    nb = _flat(markdown("03_sharing_strategies.ipynb"))
    assert "mpviz's child shows 9" in nb and "Real torch's child shows 8" in nb


def test_torch_fills_dev_shm_without_any_switch_and_sweeps_at_the_end():
    # pitfall 11 was once shown only with manager=False, a switch torch does not have
    import time
    program = os.path.join(NOTEBOOKS, "programs", "torch_shm_fills.py")
    with open(program) as f:
        out = _run_torch(f.read()).splitlines()
    assert out[0].endswith("3 torch_* files left in /dev/shm"), out
    assert "6 torch_* files left" in out[1], out
    files = out[-1].split()[1:]
    assert len(files) == 6
    deadline = time.monotonic() + 30
    while any(os.path.exists(f) for f in files) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [f for f in files if os.path.exists(f)], "torch_shm_manager swept nothing"
    nb = _flat(markdown("03_sharing_strategies.ipynb"))
    assert "`manager=False` is a switch torch does not have" in nb


def test_lanes_that_are_threads_are_said_to_be_threads():
    # the lanes mpviz-fd-peer and Pool's _handle_* were drawn but never explained
    assert "`└ mpviz-fd-peer`" in _flat(markdown("00_overview.ipynb"))
    nb = _flat(markdown("01_processes_queues_pools.ipynb"))
    for thread in ("_handle_tasks", "_handle_results", "_handle_workers"):
        assert f"`{thread}`" in nb


def test_small_wording_fixes_stay_fixed():
    # 11 spoke of "the red cross" where a run may kill two; 06 named torch 2.11 without saying
    # it was the CUDA build of another machine; "(seed 003)" meant nothing to a student
    nb11 = _flat(markdown("11_more_pitfalls.ipynb"))
    assert "The **red cross** is" not in nb11 and "count the red ones" in nb11
    # 11 pointed at the label "/dev/shm is full", which the crowded timeline may hide
    assert "the line printed above the picture names that worker" in nb11
    assert "startswith(\"/dev/shm is full\")" in "".join(sources("11_more_pitfalls.ipynb", "code"))
    nb06 = _flat(markdown("06_cuda_lifetime.ipynb"))
    assert "(torch 2.11)" not in nb06 and "CUDA build of torch, 2.11" in nb06
    for name in sc.names():
        module = sc.module(name)
        assert "seed 0" not in (module.__doc__ or "") + getattr(module, "SUMMARY", ""), name
    for notebook in ALL_NOTEBOOKS:
        assert "seed 00" not in _flat(markdown(notebook)), notebook


# nbclient runs in a subprocess: its ZeroMQ context keeps sockets open for the life of the process
HEADLESS = """
import json, nbformat, nbclient
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell("from mpviz.widgets import Live\\n"
                                      "live = Live('queue-sharing')\\nlive.run()\\nlive.wait(60)"),
            nbformat.v4.new_code_cell("import gc\\nlive.stop()\\ndel live\\ngc.collect()")]
nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
print(json.dumps([o.get("data", {}).get("text/plain", "") for o in nb.cells[0].outputs
                  if "image/png" in o.get("data", {})]))
"""


@pytest.mark.timeout(180)
def test_a_headless_notebook_holds_the_live_widgets_final_picture():
    # nbval/nbconvert runs once showed only "<mpviz Live ...: finished>" where a person sees
    # the picture: Live.wait() now also displays it as a plain PNG
    import json
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", HEADLESS], capture_output=True, text=True,
                         timeout=170, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    pngs = json.loads(run.stdout.strip().splitlines()[-1])
    assert pngs == ["<mpviz timeline of 'queue-sharing', at the end>"], pngs
    for notebook in ("00_overview.ipynb", "05_buffer_reuse.ipynb", "07_spawn_and_errors.ipynb",
                     "08_hogwild.ipynb"):
        assert any("live.wait(" in text for text in sources(notebook, "code")), notebook


@pytest.mark.timeout(120)
def test_notebook_09_names_the_locks_as_its_timeline_does():
    # notebook 09 drew a timeline saying "lock '_library_lock'" and "Lock 2" under text and a
    # wait-for graph that say L, A and B, and never said they are the same locks. Its text now
    # says how the timeline names them: each claim is checked on the runs it describes
    from mpviz.scenarios.puzzles import PUZZLES
    from mpviz.trace.names import for_trace
    text = "\n".join(markdown("09_be_the_scheduler.ipynb"))
    assert "`'_library_lock'`" in text and "`Lock 1` is whichever of `A` and `B`" in text

    def timeline_names(s):
        trace = s.trace.snapshot()
        _, locks = for_trace(trace)
        return {lk.id: locks.name(lk.id) for lk in trace.locks()}

    with sc.step("fork-held-lock") as s:
        for label in PUZZLES["fork-held-lock"].goal_schedule:
            s.step(label)
        assert "lock '_library_lock'" in timeline_names(s).values(), timeline_names(s)
    orders = (("main/main: acquire lock A", "child/main: acquire lock B"),
              ("child/main: acquire lock B", "main/main: acquire lock A"))
    for first, second in orders:
        with sc.step("lock-order") as s:
            s.step("main/main: start process child")
            s.step(first)
            [(taken, name)] = timeline_names(s).items()
            assert name == "Lock 1" and list(s.state().locks) == [first[-1]], (first, name)
            s.step(second)
            names = timeline_names(s)
            assert names[taken] == "Lock 1" and sorted(names.values()) == ["Lock 1", "Lock 2"], \
                (first, names)


@pytest.mark.parametrize("notebook", ALL_NOTEBOOKS)
def test_try_it_live_is_followed_by_the_live_widget(notebook):
    # notebook 03 put its torch_shm_fills cell (and the text about its six files) between
    # "Try it live (Run, then try `wait` and `strategy`):" and the Live("producer-exits") it
    # meant; the file_system text then sat under the file_descriptor heading
    with open(os.path.join(NOTEBOOKS, notebook)) as f:
        cells = json.load(f)["cells"]
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and re.search(r"Try it live\b.*:\s*$", text, re.S):
            following = [c for c in cells[i + 1:] if c["cell_type"] == "code"][:1]
            assert following and "Live(" in "".join(following[0]["source"]), (notebook, i)


def test_notebook_10_says_forkserver_workers_are_forked_from_one_server():
    # notebook 10 once said "each forkserver worker starts a new interpreter": the fork server is
    # the one new interpreter, and every worker is forked from it (its parent is the server)
    import gc
    import multiprocessing
    pool = multiprocessing.get_context("forkserver").Pool(2)
    try:
        parents = {pool.apply(os.getppid) for _ in range(4)}
    finally:
        pool.close()
        pool.join()
        del pool
        gc.collect()              # the Pool's pipes are closed when it is collected
    assert len(parents) == 1 and os.getpid() not in parents, parents
    nb = _flat(markdown("10_your_own_program.ipynb"))
    assert "each forkserver worker starts a new interpreter" not in nb
    assert "each worker is forked from that server" in nb


def test_notebook_13s_memory_sections_state_only_numbers_that_are_the_programs():
    # sections 5 and 6 print what each run measured; their text may name only the programs'
    # own constants (checked here)
    from mpviz.examples.dataloader_memory import DecodedImages
    from mpviz.exercises import nb13
    text = _flat(markdown("13_dataloader.ipynb"))
    memory = text[text.index("## 5 · A worker killed by the OOM killer"):text.index("## Questions")]
    backed = {str(nb13.LIMIT_MB), str(DecodedImages().mib), str(nb13.FLAT_MIB)}
    assert set(re.findall(r"(\d+) MiB", memory)) <= backed, re.findall(r"(\d+) MiB", memory)
    # a kill by mpviz's stand-in is never shown as the kernel's: the text says how it is marked
    assert "says **STAND-IN** in capitals" in memory and "not the kernel's" in memory
    assert "USS" in memory and "RSS" in memory
