"""The central programs of notebooks 01-04, written for real torch, to run beside mpviz's.

Each notebook draws a lesson from an mpviz run; the same program written the way a torch user
writes it (``import torch.multiprocessing as mp``) runs here, recorded by the same
``mpviz.trace.record()`` (torch_hooks.py sees torch's own sharing), and the notebook draws the
same picture of it right after mpviz's::

    notebook   program here            what the pictures share        what differs on purpose
    01         pool_map()              12 units, the idle last round  nothing: torch's Pool is
                                                                      the stdlib's
    02         fill_in_child()         one copy, a handle, the fill   who copies: torch's feeder
                                                                      thread, mpviz's put
    03         share_with_child(s)     8 segments, mapped by both     the child's fds: 8 vs 9
    04         fork_held_lock()        the dashed owner, the hang     nothing: it is fork's hang

They run in the kernel, as the notebooks' own mpviz runs do (and notebook 04's hang is about
the kernel's threads). Notebooks 05-11 run theirs as scripts instead, ``torch_beside.torch_run``:
a fresh process, so the kernel forks nothing, and notebook 11's in a private ``/dev/shm``.

Only the parent's side is called from a notebook; the children run the functions below it,
importable by name as every start method needs. torch is imported inside the functions, so this
module imports without it (``have_torch()`` says whether the torch cells can run).
"""
import importlib.util
import os
import threading

from ..scenarios import fork_held_lock as library      # its library_lock(): the same "library"
from .notebook_workers import UNIT, slow

SKIP = "torch is not installed: pip install torch==2.13.0 (CPU) to see the same in torch"


def have_torch():
    """Import torch and say True; without torch, print the one line the notebooks show instead.
    (Imported here, before a cell's ``record()``, so that its seconds are not on the picture.)"""
    if importlib.util.find_spec("torch") is None:
        print(SKIP)
        return False
    import torch.multiprocessing  # noqa: F401
    return True


# --- notebook 01: Pool.map with the default chunksize -----------------------------------------

def pool_map(items=10, processes=2, chunksize=None):
    """The tutorial's map: `items` items of 2 units each on `processes` workers."""
    import torch.multiprocessing as mp
    with mp.Pool(processes=processes) as pool:
        return pool.map(slow, range(items), chunksize)


def chunks_and_units(trace):
    """What a recorded map did: how many chunks each worker ran (busiest first), and how many
    units from the first chunk's start to the last one's end (as pool-chunksize measures)."""
    tasks = trace.of_kind("pool.task")
    starts = [e for e in tasks if e.args.get("phase") == "start"]
    ends = [e.ts_ns for e in tasks if e.args.get("phase") == "done"]
    per_worker = {}
    for e in starts:
        per_worker[e.pid] = per_worker.get(e.pid, 0) + 1
    units = (max(ends) - min(e.ts_ns for e in starts)) / 1e9 / UNIT
    return sorted(per_worker.values(), reverse=True), units


# --- notebook 02: a child fills the tensor it got from a Queue --------------------------------

def fill(q, results, value):
    """The child: get a tensor, ``fill_(value)`` it, then say how it arrived."""
    t = q.get()
    arrived = {"is_shared": t.is_shared(), "shape": tuple(t.shape)}
    t.fill_(value)
    results.put(arrived)


def fill_in_child(value=7.0, numel=16):
    """The parent: put ``torch.zeros(4, numel // 4)`` for a child that fills it with `value`;
    returns (x, what the child said of the tensor that arrived)."""
    import torch
    import torch.multiprocessing as mp
    q, results = mp.Queue(), mp.Queue()
    x = torch.zeros(4, numel // 4)
    child = mp.Process(target=fill, args=(q, results, value), name="child")
    child.start()
    q.put(x)
    arrived = results.get(timeout=60)         # sent after the fill: x is filled now
    child.join()
    for queue in (q, results):               # closed here: nothing of theirs outlives the cell
        queue.close()
        queue.join_thread()
    return x, arrived


# --- notebook 03: a parent shares 8 tensors with a child, under one strategy ------------------

def open_fds():
    return len(os.listdir("/proc/self/fd"))


def hold(q, out, count, done):
    """The child: get `count` tensors and keep them; report its open fds before and while."""
    before = open_fds()
    kept = [q.get() for _ in range(count)]
    out.put({"extra_fds": open_fds() - before, "sum": sum(t.sum().item() for t in kept)})
    done.wait(20)                             # hold them until the parent has looked


def share_with_child(strategy, count=8):
    """The parent: share `count` tensors of 256 floats with a child under `strategy`; returns
    what the child said: its extra open fds, and the sum of what it holds."""
    import torch
    import torch.multiprocessing as mp
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy(strategy)
    try:
        q, out, done = mp.Queue(), mp.Queue(), mp.Event()
        child = mp.Process(target=hold, args=(q, out, count, done), name="child")
        child.start()
        tensors = [torch.full((256,), float(i)) for i in range(count)]
        for t in tensors:
            q.put(t)
        report = out.get(timeout=60)
        done.set()
        child.join()
        for queue in (q, out):
            queue.close()
            queue.join_thread()
        return report
    finally:
        mp.set_sharing_strategy(previous)


def child_holds(trace):
    """The moment the child has mapped every tensor it was sent (its last ``shm.attach``)."""
    return max(e.ts_ns for e in trace.of_kind("shm.attach"))


# --- notebook 04: a thread holds a lock at the moment of fork ---------------------------------

def use_library():
    """The child: call into the library, which takes its lock."""
    with library.library_lock():
        pass


def fork_held_lock():
    """The parent: fork a child while a thread holds the library's lock, then join it (under
    fork, for ever: run it under a watchdog). Returns the child's exit code."""
    import torch.multiprocessing as mp
    library._library_lock = None              # a fresh lock each run, made while recording
    held, forked = threading.Event(), threading.Event()
    worker = threading.Thread(target=library._busy_thread, args=(held, forked),  # the scenario's
                              name="library-worker")                           # busy thread
    worker.start()
    held.wait(10)
    child = mp.get_context("fork").Process(target=use_library, name="child")
    child.start()
    forked.set()
    worker.join()
    child.join()
    return child.exitcode
