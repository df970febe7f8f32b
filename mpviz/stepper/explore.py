"""Many schedules: is there one that breaks the program? (the fix should survive them all)

    random_schedules(make, n=20, seed=0)   n runs, each choosing at random at every stop
    all_schedules(make, limit=200)         every schedule, depth first, while there are at
                                           most `limit` of them (a run per schedule)

`make()` returns a fresh Stepper (``lambda: mpviz.scenarios.step("lock-order", same_order=True)``).
Both return ``{outcome: count}`` and the schedule (the labels stepped) of the first run of each
outcome, so that a failing schedule can be replayed by hand (``stepper.restart(schedule)``).
A real run cannot be rewound, so every schedule is a fresh run: it costs a second or two, and a
program with many stops has far too many schedules to try them all -- hence random ones.
Adapted from systematic concurrency testing (CHESS; loom's exhaustive model checking); left out:
partial-order reduction (two stops of different processes that touch different objects commute,
and need not be tried in both orders).
"""
import random
from collections import Counter


def random_schedules(make, n=20, seed=0):
    """Run `n` random schedules; returns (Counter of outcomes, {outcome: first schedule})."""
    rng = random.Random(seed)
    outcomes, examples = Counter(), {}
    for _ in range(n):
        with make() as s:
            outcome = s.run_until(lambda s: False, choose=rng.choice)
            outcomes[outcome] += 1
            examples.setdefault(outcome, list(s.history))
    return outcomes, examples


def all_schedules(make, limit=200):
    """Every schedule (each a fresh run), depth first; ValueError past `limit` runs."""
    outcomes, examples = Counter(), {}
    todo = [[]]                           # prefixes (indexes into each stop's choices) to run
    runs = 0
    while todo:
        prefix = todo.pop()
        runs += 1
        if runs > limit:
            raise ValueError(f"more than {limit} schedules; use random_schedules, or raise limit")
        for attempt in range(3):
            ran = _run_prefix(make, prefix)
            if ran is not None:
                break
        else:
            raise RuntimeError(
                f"all_schedules: replaying the schedule {prefix} found fewer choices at a stop "
                f"than its first run did, three times: the run is not the same at its stops from "
                f"one run to the next (a thread reaching its stop late, on a loaded machine?). "
                f"Fix: use random_schedules, or make the stepped function's threads reach their "
                f"stops without depending on time.")
        outcome, history, later = ran
        todo.extend(later)
        outcomes[outcome] += 1
        examples.setdefault(outcome, history)
    return outcomes, examples


def _run_prefix(make, prefix):
    """One fresh run that takes the choices `prefix` names, then the first choice at each stop:
    (outcome, the labels stepped, the prefixes of the other choices at the new stops), or None
    when a stop offered fewer choices than `prefix` names (the replay went another way)."""
    later = []
    with make() as s:
        taken = []
        while True:
            choices = s.choices()
            if not choices:
                break
            if choices[0].op == "time":       # nobody paused: time moves the run, whichever
                s.step(choices[0])            # sleeper is named -- not a choice of schedule
                continue
            depth = len(taken)
            pick = prefix[depth] if depth < len(prefix) else 0
            if pick >= len(choices):
                return None
            if depth >= len(prefix):          # a new stop: its other choices are for later
                later.extend(taken + [i] for i in range(len(choices) - 1, 0, -1))
            taken.append(pick)
            s.step(choices[pick])
        return s.outcome, list(s.history), later
