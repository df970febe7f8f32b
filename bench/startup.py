"""What users wait for before their first line runs: ``mpviz trace``, ``import mpviz``, ``spawn``.

    python -m bench.startup                    # 7 rounds; prints a Markdown table
    python -m bench.startup --before /some/old/checkout --rounds 9

Rows (each a fresh process, timed from outside with ``time.perf_counter``):

* ``true``, untraced, and ``python -m mpviz trace -- true``: the launcher's own cost is the
  difference (goal: at most 0.3 s over the untraced run). ``--no-plot`` is not given: ``true``
  exits 0, so the launcher draws nothing anyway, as users run it.
* ``import mpviz`` in a fresh interpreter (``python -c 'import mpviz'`` minus ``python -c pass``).
* ``spawn(nprocs=2)`` of an empty function, from a script of its own (:mod:`bench.spawn_startup`),
  for mpviz and torch: each library's children import only what that script imports. Goal:
  mpviz at most 0.15x torch.

Every contender runs once per round, in turn, round after round, so that a burst of load from
something else on the machine hits all of them alike. ``--before DIR`` adds the same mpviz rows
run from another checkout (``PYTHONPATH=DIR``), for a before/after measured side by side.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SPAWN_SCRIPT = os.path.join(HERE, "spawn_startup.py")
TRUE, PASS = "`true`, untraced", "`python -c pass`"
TRACE, IMPORT, SPAWN = "`mpviz trace -- true`", "`import mpviz`", "`spawn(nprocs=2)`"


def _env(tree):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _wall(argv, env, cwd):
    """Seconds from start to exit of `argv` (its output thrown away); raises if it failed."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=120)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode()[-300:]}")
    return took


def _spawn(library, env):
    """One spawn(nprocs=2) start+join, timed inside its own script."""
    r = subprocess.run([sys.executable, SPAWN_SCRIPT, library, "1"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"spawn_startup.py {library} exited {r.returncode}: {r.stderr[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["times"][0]


def contenders(trees, torch):
    """{row name: function of a scratch directory -> seconds}."""
    py = sys.executable
    rows = {TRUE: lambda d: _wall(["true"], None, d),
            PASS: lambda d: _wall([py, "-c", "pass"], None, d)}
    for label, tree in trees.items():
        env = _env(tree)
        rows[f"{TRACE}{label}"] = \
            lambda d, env=env: _wall([py, "-m", "mpviz", "trace", "--", "true"], env, d)
        rows[f"{IMPORT}{label}"] = lambda d, env=env: _wall([py, "-c", "import mpviz"], env, d)
        rows[f"{SPAWN} mpviz{label}"] = lambda d, env=env: _spawn("mpviz", env)
    if torch:
        rows[SPAWN + " torch"] = lambda d: _spawn("torch", _env(ROOT))
    return rows


def measure(rounds=7, before=None, torch=True, log=lambda msg: None):
    """{row: [seconds, ...]}, contenders alternating round by round."""
    trees = {"": ROOT}
    if before:
        trees = {" (before)": os.path.abspath(before), " (after)": ROOT}
    rows = contenders(trees, torch)
    times = {name: [] for name in rows}
    errors = {}
    with tempfile.TemporaryDirectory(prefix="mpviz-bench-startup-") as scratch:
        for n in range(rounds):
            log(f"round {n + 1}/{rounds}")
            for name, run in rows.items():
                if name in errors:
                    continue
                try:
                    times[name].append(run(scratch))
                except Exception as exc:      # noted in the table, the other rows go on
                    errors[name] = f"{type(exc).__name__}: {exc}"
    return times, errors


def _ms(seconds):
    return f"{seconds * 1e3:.0f} ms"


def markdown(times, errors):
    med = {k: statistics.median(v) for k, v in times.items() if v}
    lines = ["| what | median (min–max), ms | against | goal |", "|---|---|---|---|"]
    for name, values in times.items():
        if name in errors:
            lines.append(f"| {name} | failed: {errors[name]} | | |")
            continue
        against, goal = "", ""
        if name.startswith(TRACE):
            over = med[name] - med[TRUE]
            against, goal = f"{over * 1e3:+.0f} ms over `true`", "≤ +300 ms"
        elif name.startswith(IMPORT):
            against = f"{(med[name] - med[PASS]) * 1e3:+.0f} ms over `python -c pass`"
        elif name.startswith(SPAWN + " mpviz") and SPAWN + " torch" in med:
            against = f"{med[name] / med[SPAWN + ' torch']:.2f}× torch"
            goal = "≤ 0.15× torch"
        lines.append(f"| {name} | {_ms(med[name])} ({_ms(min(values))}–{_ms(max(values))}) | "
                     f"{against} | {goal} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", metavar="DIR",
                        help="another checkout whose mpviz to time too, alternating with this one")
    parser.add_argument("--no-torch", action="store_true", help="leave torch's spawn out")
    parser.add_argument("--json", metavar="FILE", help="also write the raw times here")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    times, errors = measure(args.rounds, args.before, not args.no_torch,
                            log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds, contenders alternating\n")
    print(markdown(times, errors))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"times": times, "errors": errors, "load": [load, os.getloadavg()]}, f)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
