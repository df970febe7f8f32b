"""``spawn(nprocs=2)`` from a script of its own: how long a start+join of two children takes.

    python bench/spawn_startup.py mpviz 5     # prints {"library": ..., "times": [seconds, ...]}
    python bench/spawn_startup.py torch 5

Each spawned child is a fresh interpreter that imports the parent's main module again (as
``__mp_main__``): this file. So a child imports exactly what this file imports at its top --
nothing but the library's ``multiprocessing`` package, imported below, once the library is known
(from ``MPVIZ_BENCH_LIBRARY``, which the children inherit). That is what a user's training script
costs its children, and it is the figure to compare: a driver that imported NumPy or both
libraries would make every child import them too.

``bench.run`` runs this for each library in turn, a few spawns each, round after round.
"""
import json
import os
import sys
import time

LIBRARY = os.environ.setdefault("MPVIZ_BENCH_LIBRARY", sys.argv[1] if len(sys.argv) > 1 else "mpviz")
if LIBRARY == "torch":
    import torch.multiprocessing as mp
elif LIBRARY == "mpviz":
    import mpviz.multiprocessing as mp
else:
    raise SystemExit(f"spawn_startup.py: unknown library {LIBRARY!r}. Fix: mpviz or torch")


def nothing(rank):
    """The children's work: none, so the time is all start-up and join."""


def main(n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        mp.spawn(nothing, nprocs=2)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"library": LIBRARY, "times": times}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
