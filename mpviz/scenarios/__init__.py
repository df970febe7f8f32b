"""mpviz.scenarios: runnable teaching cases, each with a watchdog and a verdict.

    import mpviz.scenarios as sc
    sc.catalog()                                  # names, one-line summaries, parameters
    r = sc.run("fork-held-lock")                  # -> Result(trace, outcome, explanation, ...)
    r.outcome, print(r.explanation)               # 'deadlock', what happened / why / the fix
    r = sc.run("fork-held-lock", start_method="spawn")    # the other side of the lesson: 'ok'

How a run works (one mechanism per module)::

    caller (your kernel, a test, the CLI)           a fresh driver process (python -m ..._driver)
    -------------------------------------           ---------------------------------------------
    start(): validate params, make a trace dir,     records into the trace dir (mpviz.trace.record)
      start the driver in its own session  ───────▶ runs the case's drive(p, details): starts its
    watchdog thread (runner.py):                    processes, observes, writes details.json
      the hang watchdog of `mpviz trace`: every
      thread waits for ever, STALL_SECONDS → stuck:
        SIGUSR1 to every process of the run ──────▶ faulthandler prints each one's Python stacks
        (registered in every process by _site/sitecustomize.py) into the trace dir
        stacks become watchdog.stuck events; then SIGKILL the whole session
      afterwards, always: kill leftovers, unlink the /dev/shm segments this run created,
      load the trace, verdict(trace, details) → Result

The driver is a separate interpreter because a spawned child must import its worker functions,
and a notebook's ``__main__`` is not importable; each case's workers live in its module here.
"""
import importlib

from .base import OUTCOMES, Param, Result, ScenarioInfo, coerce

# name -> module, in the order catalog() lists them; names are stable (notebooks, tests and
# the CLI call a case by its name)
SCENARIOS = {
    "queue-sharing": "queue_sharing",
    "grad-sharing": "grad_sharing",
    "strategies": "strategies",
    "too-many-fds": "too_many_fds",
    "fs-leak": "fs_leak",
    "producer-exits": "producer_exits",
    "fork-held-lock": "fork_held_lock",
    "queue-join-deadlock": "queue_join_deadlock",
    "buffer-reuse": "buffer_reuse",
    "spawn-error": "spawn_error",
    "unguarded-main": "unguarded_main",
    "notebook-function": "notebook_function",
    "pool-chunksize": "pool_chunksize",
    "hogwild": "hogwild",
    "cuda-producer-exits": "cuda_producer_exits",
    "cuda-repass": "cuda_repass",
    "cuda-same-queue": "cuda_same_queue",
    "cuda-release-late": "cuda_release_late",
    # the pitfalls of torch_multiprocessing_behaviour.md §4 that the cases above leave out
    "cuda-in-forked-child": "cuda_forked_child",
    "autograd-fork": "autograd_fork",
    "small-shm": "small_shm",
    "oom-killed": "oom_killed",
    "forkserver-default": "forkserver_default",
    "non-leaf-put": "non_leaf_put",
    "sender-fds": "sender_fds",
    "shm-wiped": "shm_wiped",
    "optimizer-state": "optimizer_state",
    "oversubscription": "oversubscription",
}

__all__ = ["catalog", "start", "run", "step", "names", "Param", "ScenarioInfo", "Result", "Running",
           "OUTCOMES", "SCENARIOS"]


def names():
    """The scenario names, in catalog order."""
    return list(SCENARIOS)


def module(name):
    """The module that implements scenario `name` (ValueError listing the names otherwise)."""
    if not isinstance(name, str):
        raise TypeError(f"a scenario name is a str such as 'fs-leak', not {type(name).__name__}")
    key = name.replace("_", "-")
    if key not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; the scenarios are: {', '.join(SCENARIOS)}")
    return importlib.import_module(f"{__name__}.{SCENARIOS[key]}")


def catalog():
    """Every scenario: ``ScenarioInfo(name, summary, params)``, params = {name: Param}."""
    out = []
    for name in SCENARIOS:
        mod = module(name)
        out.append(ScenarioInfo(name, mod.SUMMARY, dict(mod.PARAMS)))
    return out


def resolve(name, params):
    """The full parameter dict for `name`: defaults overridden by `params`, each validated."""
    mod = module(name)
    name = name.replace("_", "-")
    unknown = sorted(set(params) - set(mod.PARAMS))
    if unknown:
        valid = ", ".join(f"{k} (default {v.default!r})" for k, v in mod.PARAMS.items()) or "none"
        raise ValueError(f"scenario {name!r} has no parameter {', '.join(map(repr, unknown))}; "
                         f"its parameters are: {valid}")
    out = {}
    for key, param in mod.PARAMS.items():
        out[key] = coerce(key, param, params.get(key, param.default), name) if key in params \
            else param.default
    check = getattr(mod, "check_params", None)
    if check is not None:
        check(out)
    return out


def start(name, trace_dir=None, **params):
    """Start scenario `name` with `params` and return at once a ``Running`` (see runner.py).

    `trace_dir`: where to record (default: a new temporary directory, removed when this
    process exits). Unknown names, parameters or values raise ValueError listing valid ones.

        import mpviz.scenarios as sc
        running = sc.start("hogwild", share=False)  # does not block: for live pictures
        running.trace()                             # the events so far (a live mpviz.trace.Trace)
        running.result(timeout=30)                  # wait for the verdict; running.stop() kills it
    """
    from .runner import Running
    resolved = resolve(name, params)
    return Running(name.replace("_", "-"), resolved, trace_dir=trace_dir)


def run(name, trace_dir=None, **params):
    """Run scenario `name` to its verdict: ``start(name, **params).result()``."""
    return start(name, trace_dir=trace_dir, **params).result()


def step(name, **params):
    """Puzzle `name` run stepped: you choose who goes next (see puzzles.py); returns a Stepper."""
    from .puzzles import step as step_puzzle
    return step_puzzle(name, **params)


def __getattr__(attr):
    if attr == "Running":
        from .runner import Running
        return Running
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
