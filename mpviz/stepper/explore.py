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
        with make() as s:
            taken = []
            while True:
                choices = s.choices()
                if not choices:
                    break
                depth = len(taken)
                pick = prefix[depth] if depth < len(prefix) else 0
                if depth >= len(prefix):          # a new stop: its other choices are for later
                    todo.extend(taken + [i] for i in range(len(choices) - 1, 0, -1))
                taken.append(pick)
                s.step(choices[pick])
            outcome = s.outcome
            outcomes[outcome] += 1
            examples.setdefault(outcome, list(s.history))
    return outcomes, examples
