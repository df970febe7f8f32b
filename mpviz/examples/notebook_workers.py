"""The worker functions of the workshop notebooks (00-04), importable so every start method works.

A child process started with ``spawn`` or ``forkserver`` is a fresh interpreter: it finds the
function it must run by *importing it by name* (``mpviz.examples.notebook_workers.foo``). A
function typed into a notebook cell lives in the kernel's ``__main__``, which a child cannot
import -- so the notebooks keep their workers here and call them as ``nw.foo``::

    notebook cell                          child process (any start method)
    from mpviz.examples import \\
        notebook_workers as nw
    mp.Process(target=nw.foo, args=(1,))  ─▶ import mpviz.examples.notebook_workers; foo(1)

The first group follows the tutorial "Multiprocessing in Python and PyTorch" (the workshop's
notebook 01), with its seconds scaled down: one tutorial second is ``UNIT`` seconds here, so
``foo`` "sleeps 2 seconds" in 0.2 s. The second group receives tensors and reports what arrived
(notebooks 02 and 03). Every worker prints what it does *and* sends its answer back through a
queue or a pipe, because a child's prints are not always shown in a notebook.
"""
import os
import time

UNIT = 0.1            # seconds per "tutorial second"


# --- notebook 01: processes, queues, pipes, pools (the tutorial's functions) -----------------

def foo(x):
    """The tutorial's first worker: say hello, "sleep 2 seconds", return `x`."""
    print(f"foo({x}) in process {os.getpid()}", flush=True)
    time.sleep(2 * UNIT)
    return x


def producer(x, q):
    """Put `x` on the queue `q` (the tutorial's ``foo(x, q)``)."""
    print(f"Putting {x} in queue", flush=True)
    q.put(x)


def consumer(q, results=None):
    """Get one item from `q` and say so (the tutorial's ``bar(q)``); report it on `results`."""
    item = q.get()
    print(f"Got {item} from queue", flush=True)
    if results is not None:
        results.put(("got", item, os.getpid()))


def echo(conn):
    """One end of a ``Pipe``: receive messages and answer each, until ``None`` arrives."""
    while True:
        msg = conn.recv()
        if msg is None:
            break
        conn.send(f"child {os.getpid()} got {msg!r}")
    conn.close()


def add(x, y):
    """The tutorial's ``Pool.apply`` worker: "sleep 3 seconds", return ``x + y``."""
    time.sleep(3 * UNIT)
    return x + y


def slow(x):
    """The tutorial's ``Pool.map`` worker: "sleep 2 seconds", return `x`."""
    time.sleep(2 * UNIT)
    return x


def slow_add(x, y):
    """The tutorial's ``starmap`` worker ``bar(x, y)``: "sleep 2 seconds", return ``x + y``."""
    time.sleep(2 * UNIT)
    return x + y


# --- notebooks 02-03: tensors that travel ---------------------------------------------------

def describe(t):
    """What a tensor looks like from inside a process: a dict of plain values."""
    storage = t.untyped_storage()
    return {"pid": os.getpid(), "shape": tuple(t.shape), "storage_offset": t.storage_offset(),
            "stride": tuple(t.stride()), "storage_bytes": storage.nbytes(),
            "is_shared": t.is_shared(), "where": storage.location,
            "grad": None if t.grad is None else t.grad.tolist()}


def receive_and_fill(q, results, value):
    """Get a tensor from `q`, report what arrived, ``fill_(value)`` it, report again.

    The parent reads two dicts from `results` (see ``describe``): before and after the write.
    A shared tensor's write shows in the parent; a private copy's would not.
    """
    t = q.get()
    before = describe(t)
    t.fill_(value)
    results.put((before, t.tolist()))


def report_grad(t, results):
    """Report the ``.grad`` of the tensor `t` as this process sees it: a list, or None.

    Plain tensor methods only, so a real ``torch`` tensor works too (notebook 02 runs it under
    real torch, to show what torch does with ``.grad``)."""
    results.put(None if t.grad is None else t.grad.tolist())


# --- notebook 04: a function for a spawn Pool -------------------------------------------------

def square(x):
    """``x * x``, importable: what a spawn Pool needs (notebook 04 defines one in a cell, too)."""
    return x * x


# --- a helper for the pictures (runs in the notebook, not in a child) -------------------------

def mark_time(trace, words):
    """The time (``ts_ns``) of the first ``mark`` event whose name contains `words`.

    Scenarios mark their key moments ("child holds the tensors", "SIGKILL the holder"); pass
    the result as ``at=`` to ``mpviz.viz.memory_map`` or ``timeline`` to see that instant.
    ValueError, listing the marks there are, if none matches.
    """
    marks = trace.of_kind("mark")
    for event in marks:
        if words in str(event.args.get("name", "")):
            return event.ts_ns
    names = ", ".join(repr(e.args.get("name")) for e in marks) or "none"
    raise ValueError(f"no mark containing {words!r} in this trace; its marks are: {names}")
