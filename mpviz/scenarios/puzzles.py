"""Puzzles for ``mpviz.scenarios.step(name)``: you are the scheduler; reach the goal, then try the fix.

Each puzzle is a small program of real processes, run stepped (see mpviz/stepper): every lock
acquire/release, Queue put/get, feeder write, process start/join and Event set/clear/wait waits
for you to choose who goes next (and so does a shared-memory attach: a spawned child that is given
a tensor maps its memory before its first line). Each has a goal (a schedule that breaks it), a
known schedule that reaches the goal for each start method (``goal_schedule_for(start_method)``,
for tests and for an instructor in a hurry: the start of each choice's label), and a fix
(``fix``: the parameters that repair it) under which *no* schedule breaks it -- try as many as you
like (``mpviz.stepper.random_schedules`` / ``all_schedules``)::

    fork-held-lock     a thread holds the library's lock when main forks: the child's copy of the
                       lock is held by a thread that was never copied        fix: spawn
    queue-feeder-hang  a child puts 1 MiB, the parent joins it before getting: the feeder can't
                       write more than the pipe holds, the child can't exit  fix: get, then join
    lock-order         two processes take locks A and B in opposite orders   fix: the same order
    lost-wakeup        the consumer clears the Event after the producer's second set: that
                       wake-up is lost                                       fix: clear, check, wait
    torn-read          the consumer reads the shared tensor while the producer is half-way
                       through writing it: old and new values mixed           fix: one lock for both

The workers are here (importable: a spawned child imports them). Names given with
``mpviz.stepper.name`` are what the choices call the locks, queues and events.
"""
import multiprocessing
import threading
from typing import Callable, NamedTuple

from ..stepper import name, point
from .base import Param, coerce

START = Param("fork", ["fork", "spawn", "forkserver"], "how children start")


class Puzzle(NamedTuple):
    name: str
    summary: str
    goal: str
    params: dict                 # name -> Param
    drive: Callable              # drive(p, details): the program (the run's first process)
    verdict: Callable            # verdict(outcome, explanation, details) -> (outcome, explanation)
    goal_schedules: dict         # start method -> the choices to step, in order, that reach
                                 # the goal (each the start of a label; the other params default)
    fix: dict                    # the params under which no schedule reaches the goal

    @property
    def goal_schedule(self):
        """The schedule that reaches the goal with the default parameters (fork)."""
        return self.goal_schedules["fork"]

    def goal_schedule_for(self, start_method):
        """The schedule that reaches the goal when children start by `start_method`. They
        differ: a spawned child unpickles its arguments, so a tensor among them is one more
        stop ("attach shared memory ...") before the child's first line; a forked child
        inherits the mapping and has no such stop."""
        if start_method not in self.goal_schedules:
            raise ValueError(
                f"puzzle {self.name!r}: no schedule reaches its goal with start_method="
                f"{start_method!r} (that is its fix: {self.fix}). Fix: start_method one of "
                f"{', '.join(map(repr, self.goal_schedules))}.")
        return self.goal_schedules[start_method]


def _on_deadlock(goal_reached):
    """A verdict that says `goal_reached` when the run ended in a deadlock (the goal of every
    puzzle but torn-read), and leaves any other outcome and its explanation as they are."""
    def verdict(outcome, explanation, details):
        return outcome, goal_reached if outcome == "deadlock" else explanation
    return verdict


# --- fork-held-lock ------------------------------------------------------------------------

_library_lock = None


def library_lock():
    """The 'library's' lock, made on first use (a fresh one in each new interpreter)."""
    global _library_lock
    if _library_lock is None:
        _library_lock = name(threading.Lock(), "L")
    return _library_lock


def call_library():
    with library_lock():          # the library's work, under its lock
        pass


def fork_lock_drive(p, details):
    ctx = multiprocessing.get_context(p["start_method"])
    library_lock()
    worker = threading.Thread(target=call_library, name="library-worker")
    worker.start()
    child = ctx.Process(target=call_library, name="child")
    child.start()
    child.join()
    worker.join()
    details["child_exitcode"] = child.exitcode


fork_lock_verdict = _on_deadlock(
    "Goal reached: the child waits forever for lock L. main forked while library-worker "
    "held L; fork copied the lock, held, into the child, but not the thread that held "
    "it, so nobody in the child can release it -- and main waits forever in join(). "
    "Fix: start_method='spawn' (a fresh interpreter makes a fresh lock).")


# --- queue-feeder-hang ---------------------------------------------------------------------

def put_big(q, nbytes):
    q.put(b"x" * nbytes)


def feeder_drive(p, details):
    ctx = multiprocessing.get_context(p["start_method"])
    q = name(ctx.Queue(), "Q")
    child = ctx.Process(target=put_big, args=(q, p["nbytes"]), name="child")
    child.start()
    if p["get_before_join"]:
        details["received"] = len(q.get())
        child.join()
    else:
        child.join()
        details["received"] = len(q.get())


feeder_verdict = _on_deadlock(
    "Goal reached: main waits forever in join(). The child's put only buffered the item; "
    "its feeder thread writes it into the pipe, which holds 64 KiB, so the write waits "
    "for a reader; the child, exiting, waits for its feeder; main waits for the child, "
    "and its get() comes after the join. Fix: get_before_join=True.")


# --- lock-order ----------------------------------------------------------------------------

def take_both(first, second):
    with first:
        with second:
            pass


def lock_order_drive(p, details):
    ctx = multiprocessing.get_context(p["start_method"])
    a, b = name(ctx.Lock(), "A"), name(ctx.Lock(), "B")
    child = ctx.Process(target=take_both, args=(a, b) if p["same_order"] else (b, a),
                        name="child")
    child.start()
    take_both(a, b)
    child.join()


lock_order_verdict = _on_deadlock(
    "Goal reached: main holds A and waits for B; child holds B and waits for A. A cycle "
    "in the wait-for graph: neither can ever go on. Fix: same_order=True (every process "
    "takes A before B: the one that gets A first also gets B).")


# --- lost-wakeup ---------------------------------------------------------------------------

ITEMS = 2


def produce(ready, produced):
    for _ in range(ITEMS):
        produced.value += 1       # an item is ready ...
        ready.set()               # ... wake the consumer


def consume_buggy(ready, produced, taken):
    for _ in range(ITEMS):
        ready.wait()              # wait for an item
        taken.value += 1
        ready.clear()             # reset for the next one -- and maybe erase its wake-up


def consume_fixed(ready, produced, taken):
    while taken.value < ITEMS:
        ready.clear()                         # clear first, then look: a set after this
        if produced.value > taken.value:      # clear is never lost, and an item produced
            taken.value += 1                  # before it is seen by this check
            continue
        ready.wait()


def lost_wakeup_drive(p, details):
    ctx = multiprocessing.get_context(p["start_method"])
    ready = name(ctx.Event(), "ready")
    produced, taken = ctx.RawValue("i", 0), ctx.RawValue("i", 0)
    consumer = ctx.Process(target=consume_fixed if p["clear_first"] else consume_buggy,
                           args=(ready, produced, taken), name="consumer")
    producer = ctx.Process(target=produce, args=(ready, produced), name="producer")
    consumer.start()
    producer.start()
    producer.join()
    consumer.join()
    details["taken"] = taken.value


lost_wakeup_verdict = _on_deadlock(
    "Goal reached: the consumer waits forever for the event, although the producer made "
    "both items. Its second set() came while the event was still set (nothing changed), "
    "then the consumer's clear() erased it: a lost wake-up. Fix: clear_first=True -- "
    "clear, then check for work, then wait: a set after the clear is never lost.")


# --- torn-read -----------------------------------------------------------------------------

N = 4


def write_rounds(t, lock):
    for value in (1, 2):
        if lock is not None:
            lock.acquire()
        for i in range(N):
            point(f"write t[{i}] = {value}")
            t[i] = value
        if lock is not None:
            lock.release()


def read_once(t, seen, lock):
    if lock is not None:
        lock.acquire()
    point("read the whole tensor t")
    seen[:] = t
    if lock is not None:
        lock.release()


def torn_read_drive(p, details):
    import mpviz
    ctx = multiprocessing.get_context(p["start_method"])
    t = mpviz.zeros(N).share_memory_()
    seen = mpviz.zeros(N).share_memory_()
    lock = name(ctx.Lock(), "T") if p["lock"] else None
    producer = ctx.Process(target=write_rounds, args=(t, lock), name="producer")
    consumer = ctx.Process(target=read_once, args=(t, seen, lock), name="consumer")
    producer.start()
    consumer.start()
    producer.join()
    consumer.join()
    details["seen"] = [float(v) for v in seen.tolist()]


def torn_read_verdict(outcome, explanation, details):
    seen = details.get("seen")
    if outcome == "ok" and seen is not None and len(set(seen)) > 1:
        return "race", (
            f"Goal reached: the consumer read t = {seen}: part written by one round, part by "
            f"another (or not yet written). Shared memory has no transactions: a reader sees "
            f"each element as it is at that instant (Hogwild accepts this for gradients; a "
            f"consumer of finished results must not). Fix: lock=True (one lock around each "
            f"round of writes and around the read).")
    if outcome == "ok" and seen is not None:
        return "ok", f"The consumer read t = {seen}: one round's values, whole."
    return outcome, explanation


def _every_start_method(schedule):
    return {"fork": schedule, "spawn": schedule, "forkserver": schedule}


_TORN_READ = ["main/main: start process producer", "main/main: start process consumer",
              "producer/main: write t[0] = 1", "producer/main: write t[1] = 1",
              "consumer/main: read the whole tensor t"]
# spawn and forkserver: each child unpickles the tensors it was given -- one attach each (the
# producer: t; the consumer: t and seen) before its first line; a forked child inherits them
_TORN_READ_UNPICKLED = (_TORN_READ[:2] + ["producer/main: attach shared memory"]
                        + _TORN_READ[2:4] + ["consumer/main: attach shared memory"] * 2
                        + _TORN_READ[4:])

PUZZLES = {p.name: p for p in [
    Puzzle("fork-held-lock", "a thread holds a lock at fork; the child's copy is held forever",
           "Make the child wait forever for the library's lock L.",
           {"start_method": START}, fork_lock_drive, fork_lock_verdict,
           {"fork": ["main/library-worker: acquire lock L", "main/main: start process child",
                     "child/main: acquire lock L", "main/main: join process child",
                     "main/library-worker: release lock L"]},     # (spawn, forkserver: the fix)
           {"start_method": "spawn"}),
    Puzzle("queue-feeder-hang", "a child puts 1 MiB; main joins it before getting",
           "Make main wait forever in join().",
           {"start_method": START,
            "get_before_join": Param(False, [False, True], "get the item, then join (the fix)"),
            "nbytes": Param(1 << 20, None, "bytes the child puts (a pipe holds 64 KiB)")},
           feeder_drive, feeder_verdict,
           _every_start_method(["main/main: start process child",
                                "child/main: put an item on queue Q",
                                "main/main: join process child",
                                "child/QueueFeederThread: write"]),
           {"get_before_join": True}),
    Puzzle("lock-order", "two processes take locks A and B in opposite orders",
           "Make main and child each hold one lock and wait for the other.",
           {"start_method": START,
            "same_order": Param(False, [False, True], "both take A, then B (the fix)")},
           lock_order_drive, lock_order_verdict,
           _every_start_method(["main/main: start process child", "main/main: acquire lock A",
                                "child/main: acquire lock B", "main/main: acquire lock B",
                                "child/main: acquire lock A"]),
           {"same_order": True}),
    Puzzle("lost-wakeup", "the consumer clears the Event after the producer's second set",
           "Make the consumer wait forever although both items were produced.",
           {"start_method": START,
            "clear_first": Param(False, [False, True], "clear, check, then wait (the fix)")},
           lost_wakeup_drive, lost_wakeup_verdict,
           _every_start_method(["main/main: start process consumer",
                                "main/main: start process producer",
                                "producer/main: set event ready",
                                "consumer/main: wait for event ready",
                                "producer/main: set event ready",
                                "consumer/main: clear event ready",
                                "consumer/main: wait for event ready"]),
           {"clear_first": True}),
    Puzzle("torn-read", "the consumer reads a shared tensor the producer is still writing",
           "Make the consumer read a tensor that is part old, part new.",
           {"start_method": START,
            "lock": Param(False, [False, True], "one lock around writes and read (the fix)")},
           torn_read_drive, torn_read_verdict,
           {"fork": _TORN_READ, "spawn": _TORN_READ_UNPICKLED,
            "forkserver": _TORN_READ_UNPICKLED},
           {"lock": True}),
]}


def resolve(puzzle_name, params):
    """The puzzle and its full parameters (defaults, then `params`), each checked."""
    if puzzle_name not in PUZZLES:
        raise ValueError(f"unknown puzzle {puzzle_name!r}; the puzzles are: {', '.join(PUZZLES)}")
    puzzle = PUZZLES[puzzle_name]
    unknown = sorted(set(params) - set(puzzle.params))
    if unknown:
        raise ValueError(f"puzzle {puzzle_name!r} has no parameter {', '.join(map(repr, unknown))};"
                         f" its parameters are: {', '.join(puzzle.params)}")
    p = {k: coerce(k, v, params[k], puzzle_name) if k in params else v.default
         for k, v in puzzle.params.items()}
    for key, (low, high, why) in _LIMITS.items():
        if key in p and not low <= p[key] <= high:
            raise ValueError(f"puzzle {puzzle_name!r}: {key}={p[key]!r} is out of range: {why}. "
                             f"Fix: {key} between {low:,} and {high:,}.")
    return puzzle, p


# Numbers a puzzle's child really allocates: out of range, the child would die of MemoryError,
# and a stall after that death is not the puzzle's lesson.
_LIMITS = {"nbytes": (1, 256 << 20, "the child builds the item in its memory (b'x' * nbytes) "
                                    "before it puts it; more than 64 KiB (65,536) is enough to "
                                    "fill the pipe, 256 MiB the most this puzzle allows")}


def step(puzzle_name, **params):
    """A Stepper for puzzle `puzzle_name`, paused at its first stop; ``.goal`` says what to do."""
    from ..stepper.control import Stepper
    puzzle, p = resolve(puzzle_name, params)
    stepper = Stepper(("puzzle", puzzle_name, p), verdict=puzzle.verdict, title=puzzle_name)
    stepper.goal, stepper.params = puzzle.goal, p
    return stepper
