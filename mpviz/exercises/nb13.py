"""Exercises of notebook 13 (DataLoader workers): each one runs the notebook's own programs.

The first three need torch (CPU is enough); where it is not installed, each says so and judges
nothing right. The last two run torch's DataLoader where it is installed, else mpviz's:

    13.picture-collate    traces ``dataloader_lesson.py workers 2`` (python -m mpviz trace) and
                          counts the batches DataLoader worker 0 collated into shared memory
    13.predict-own-rng    runs ``dataloader_lesson.py seeds``: how many different offsets did a
                          Generator made in the dataset's __init__ give the 4 items of epoch 0?
    13.fix-timeout        runs the DataLoader of ``hang_dataloader.py`` with the learner's
                          keyword arguments, in a session of its own, killed after LIMIT_S
    13.fix-oom-cache      runs ``dataloader_memory.py cache`` with the learner's num_workers and
                          cache_items under the 256 MiB limit (a memory cgroup as root, else the
                          stand-in, named as one): did every worker finish?
    13.fix-cow-list       runs ``dataloader_memory.py`` with the learner's storage (and
                          gc.freeze()): did each worker's private memory stay under FLAT_MIB?
"""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

from .base import (BadAnswer, Exercise, Verdict, as_kwargs, as_number, finite_number, judged,
                   measured, shown)

LIMIT_S = 10                 # 13.fix-timeout: a fix must end the program within this
LIMIT_MB = 256               # 13.fix-oom-cache: the memory limit of the workers together
FLAT_MIB = 24                # 13.fix-cow-list: "flat" private memory grows less than this
                             # (a worker's own start-up: up to ~10 MiB; the list: ~90 MiB)
NEED_TORCH = ("this exercise runs real torch, which is not installed here, so no answer can be "
              "checked. Fix: install torch 2.13 (CPU is enough; ./run test installs it), then "
              "restart the kernel.")


def _torch():
    return importlib.util.find_spec("torch") is not None


def _program(*args, timeout=60):
    from ..examples.your_program import PROGRAMS, ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, os.path.join(PROGRAMS, "dataloader_lesson.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@measured
def _collated():
    """{worker name: batches it collated into shared memory}, from a traced run."""
    import tempfile
    from ..examples.your_program import trace_program
    with tempfile.TemporaryDirectory(prefix="mpviz-13-") as folder:    # the trace is read: drop it
        run = trace_program("dataloader_lesson.py", "workers", 2, directory=folder)
    names = {e.pid: f"DataLoader worker {e.args.get('worker_id')}"
             for e in run.trace.of_kind("dataloader.worker")}
    counts = {}
    for event in run.trace.of_kind("copy"):
        if event.args.get("via") == "collate":
            name = names.get(event.pid, str(event.pid))
            counts[name] = counts.get(name, 0) + 1
    return counts


@judged
def _judge_collate(answer):
    count = as_number(answer, "a number of batches")
    if not _torch():
        return Verdict(False, NEED_TORCH)
    counts = _collated()
    mine = counts.get("DataLoader worker 0", 0)
    each = ", ".join(f"{name}: {n}" for name, n in sorted(counts.items()))
    return Verdict(count == mine, (
        f"You counted {count:g}; the trace has {mine} copies of a batch into shared memory "
        f"(via='collate') on DataLoader worker 0's lane ({each}). The loader hands out batch "
        f"0 to worker 0, batch 1 to worker 1, batch 2 to worker 0 again (round robin), and each "
        f"worker's collate stacks its 4 images straight into a new shared-memory segment: "
        f"one 1 MiB red box per batch it made. The small boxes on its QueueFeederThread are "
        f"the 'worker' and 'pid' columns (4 int64 = 32 B each), moved into shared memory later, "
        f"when the batch is pickled onto the queue."))


@measured
def _epoch0_offsets():
    """[(worker, own_rng), ...] of epoch 0 in ``dataloader_lesson.py seeds``."""
    done = _program("seeds")
    found = re.findall(r"epoch 0 item \d+ worker (\d+): np.random +\d+ +self.rng +(\d+)",
                       done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"dataloader_lesson.py seeds failed (exit {done.returncode}): "
                           f"{done.stderr[-500:]}")
    return [(int(w), int(v)) for w, v in found]


@judged
def _judge_own_rng(answer):
    count = as_number(answer, "a number of different offsets")
    if not _torch():
        return Verdict(False, NEED_TORCH)
    items = _epoch0_offsets()
    values = sorted({v for _, v in items})
    return Verdict(count == len(values), (
        f"You said {count:g}; the 4 items of epoch 0 got self.rng offsets "
        f"{[v for _, v in items]} from workers {[w for w, _ in items]}: {len(values)} different "
        f"value(s). The Generator was made in __init__, in the main process; each forked worker "
        f"got a copy of it in the same state, so worker 1 draws exactly the numbers worker 0 "
        f"draws. torch 2.13 reseeds np.random (the global one), random and torch in every "
        f"worker, but it cannot know about a Generator your dataset holds."))


_CHILD = """
import json, sys
sys.path.insert(0, {programs!r})
from torch.utils.data import DataLoader
from hang_dataloader import Images
kwargs = json.loads(sys.argv[1])
for step, batch in enumerate(DataLoader(Images(), **{{"batch_size": 4, "num_workers": 1, **kwargs}})):
    print("batch", step, flush=True)
print("epoch done", flush=True)
"""


def _run_hang(kwargs):
    """Run hang_dataloader's loader with `kwargs`; kill its whole session after LIMIT_S.
    Returns (ended by itself, exit status, stderr)."""
    from ..examples.your_program import PROGRAMS
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(programs=PROGRAMS),
                              json.dumps(kwargs)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=LIMIT_S)
        return True, child.returncode, out + err
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)     # the loader and its worker, asleep in __getitem__
        out, err = child.communicate()
        return False, None, out + err
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # a worker left behind by a loader that ended
        except ProcessLookupError:
            pass


def _why_still_waiting(kwargs):
    """Why a loader made with `kwargs` was still waiting when the check stopped it."""
    if kwargs.get("num_workers", 1) == 0:
        return ("With num_workers=0 there is no worker: the main process calls __getitem__ "
                "itself and sleeps in it, and nothing can time out (torch refuses a timeout "
                "without workers).")
    timeout = kwargs.get("timeout", 0)
    if finite_number(timeout) and timeout > LIMIT_S:
        return (f"Your timeout is {timeout:g} s: the loader would raise only after that, later "
                f"than the {LIMIT_S} s the check waits. Choose one under {LIMIT_S} s.")
    return ("Without a timeout the main process waits for a worker's batch for ever (every 5 s "
            "it checks that the worker is alive -- it is, asleep).")


@judged
def _judge_timeout(answer):
    as_kwargs(answer, "DataLoader keyword arguments", "{'num_workers': 2}")
    try:
        kwargs = json.loads(json.dumps(answer, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        raise BadAnswer(f"write the keyword arguments as plain numbers, strings and booleans; "
                        f"{shown(answer)} holds something else") from None
    if not _torch():
        return Verdict(False, NEED_TORCH)
    ended, status, said = _run_hang(kwargs)
    if not ended:
        return Verdict(False, (
            f"With {shown(answer)} the loader was still waiting for the batch that holds item 5 "
            f"after {LIMIT_S} s, and the check stopped it. {_why_still_waiting(kwargs)}"))
    if "timed out" in said:
        line = next(l for l in said.splitlines() if "timed out" in l)
        return Verdict(True, (
            f"With {shown(answer)} the loader gave up within {LIMIT_S} s and raised, in the main "
            f"process: {line.strip()}. A clear error instead of a silent wait: the worker is "
            f"still stuck, but now you know which loader, and after how long."))
    last = said.strip().splitlines()[-1:] or ["(nothing)"]
    return Verdict(False, (
        f"With {shown(answer)} the program ended (exit {status}) but not by a DataLoader timeout; "
        f"its last line: {last[0][:300]}"))


def _int_option(answer, key, default, low, high, why):
    value = answer.get(key, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadAnswer(f"{key}={shown(value)}: give a whole number from {low} to {high}{why}")
    return value


@measured
def _oom_run(workers, cache_items):
    args = ["--workers", workers] + ([] if cache_items is None else ["--cache-items", cache_items])
    from ..examples import dataloader_watch as watch
    return watch.watch("cache", *args, limit_mb=LIMIT_MB)


@judged
def _judge_oom(answer):
    as_kwargs(answer, "the program's options", "{'num_workers': 2, 'cache_items': 64}")
    unknown = sorted(set(answer) - {"num_workers", "cache_items"})
    if unknown:
        raise BadAnswer(f"the program takes num_workers and cache_items, not {', '.join(unknown)}"
                        f" (the limit stays {LIMIT_MB} MiB: it is the container's)")
    workers = answer.get("num_workers", 2)
    if workers == 0 and not isinstance(workers, bool):
        raise BadAnswer("num_workers=0 starts no worker: the main process would decode and cache "
                        "all 64 images itself, 512 MiB, and the lesson's limit is on the workers. "
                        "Keep the workers (num_workers >= 1) and find what makes them grow")
    workers = _int_option(answer, "num_workers", 2, 1, 8, "")
    cache = _int_option(answer, "cache_items", None, 0, 64, ", or None (keep every image)")
    from ..examples import dataloader_watch as watch
    run = _oom_run(workers, cache)
    outcome, why = watch.oom_verdict(run)
    stand_in = (" (The limit was mpviz's STAND-IN here, not a kernel cgroup: "
                f"{run.why_no_cgroup}.)" if run.where == "stand-in" else "")
    each = "every image" if cache is None else f"up to {cache} of the images"
    told = (f"With num_workers={workers} and cache_items={cache} (each worker keeps {each} it "
            f"decodes, 8 MiB each): ")
    return Verdict(outcome == "ok" and run.status == 0, told + why + stand_in)


@measured
def _cow_run(storage, gc_freeze):
    from ..examples import dataloader_watch as watch
    return watch.watch(storage, *(["--gc-freeze"] if gc_freeze else []))


@judged
def _judge_cow(answer):
    as_kwargs(answer, "the program's options", "{'storage': 'list', 'gc_freeze': False}")
    unknown = sorted(set(answer) - {"storage", "gc_freeze"})
    if unknown:
        raise BadAnswer(f"the program takes storage and gc_freeze, not {', '.join(unknown)}")
    storage = answer.get("storage", "list")
    if storage not in ("list", "tuple", "array"):
        raise BadAnswer(f"storage={shown(storage)}: one of 'list', 'tuple' or 'array'")
    gc_freeze = answer.get("gc_freeze", False)
    if not isinstance(gc_freeze, bool):
        raise BadAnswer(f"gc_freeze={shown(gc_freeze)}: True or False")
    from ..examples import dataloader_watch as watch
    run = _cow_run(storage, gc_freeze)
    growth = watch.cow_growth(run)
    if run.status != 0 or not growth:
        return Verdict(False, f"the program failed or no worker could be measured (exit "
                              f"{run.status}): {run.messages.strip()[-300:]}")
    worst = max(g["grew"] for g in growth.values()) / watch.MIB
    said = watch.cow_summary(run, f"storage={storage!r}, gc_freeze={gc_freeze}")
    if worst < FLAT_MIB:
        return Verdict(True, (
            f"{said} Flat: every worker's private memory grew less than {FLAT_MIB} MiB. The "
            f"arrays are a few large objects: reading an item writes no refcount on the pages "
            f"fork shared; the str and int a worker makes are new objects of its own."))
    why = {"list": "every item a worker reads is a tuple, a str and an int, each with a refcount "
                   "that reading writes",
           "tuple": "a tuple of tuples holds the same objects as the list: reading an item still "
                    "writes their refcounts",
           "array": ""}[storage]
    if gc_freeze:
        why += ("; gc.freeze() keeps the garbage collector from writing to them, but not the "
                "refcounts")
    return Verdict(False, f"{said} A worker's private memory grew by up to {worst:.0f} MiB: "
                          f"{why}, and each page written is copied.")


EXERCISES = [
    Exercise(
        "13.picture-collate", "picture",
        "In the timeline of 'dataloader_lesson.py workers 2' (12 images, batch_size 4, 2 "
        "workers), how many batches did DataLoader worker 0 collate into shared memory? Count "
        "the 1 MiB red boxes on its main lane ('2 copies, 2 MiB' is two).",
        "a number of batches", _judge_collate),
    Exercise(
        "13.predict-own-rng", "predict",
        "'dataloader_lesson.py seeds': 2 workers, 4 items, each item draws an offset from "
        "self.rng, a NumPy Generator made in the dataset's __init__. How many DIFFERENT "
        "self.rng offsets do the 4 items of epoch 0 get?",
        "a number of different offsets", _judge_own_rng),
    Exercise(
        "13.fix-timeout", "fix",
        f"hang_dataloader.py's loader waits for ever for the batch that holds item 5. Give "
        f"DataLoader keyword arguments (a dict) that make it end with a clear error within "
        f"{LIMIT_S} s.",
        "a dict of DataLoader keyword arguments", _judge_timeout),
    Exercise(
        "13.fix-oom-cache", "fix",
        f"'dataloader_memory.py cache': 2 workers decode 64 images of 8 MiB and each keeps what "
        f"it decoded; a worker is SIGKILLed at the {LIMIT_MB} MiB limit. Give the program's "
        f"options (a dict: num_workers, cache_items) under which every worker finishes, the "
        f"limit unchanged.",
        "a dict of the program's options: num_workers, cache_items", _judge_oom),
    Exercise(
        "13.fix-cow-list", "fix",
        f"'dataloader_memory.py': 2 workers read a list of a million (path, label) tuples and "
        f"each one's private memory grows over the epoch. Give the program's options (a dict: "
        f"storage 'list', 'tuple' or 'array'; gc_freeze True or False) that keep every worker's "
        f"private memory within {FLAT_MIB} MiB of where it started.",
        "a dict of the program's options: storage, gc_freeze", _judge_cow),
]
