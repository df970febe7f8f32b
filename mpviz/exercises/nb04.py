"""Exercises of notebook 04 (fork, threads and deadlocks)."""
import gc
import time

from .. import multiprocessing as mp
from .base import (BadAnswer, Exercise, Verdict, judged, measured, predict_outcome, run,
                   shown)

_ITEMS = range(8)


_TIME_LIMIT_S = 30.0


@judged
def _judge_fix(answer):
    if not callable(answer):
        raise BadAnswer(f"the answer is a function (its name, without calling it), not "
                        f"{shown(answer)}")
    name = getattr(answer, "__qualname__", shown(answer))
    where = getattr(answer, "__module__", None)
    pool = mp.get_context("spawn").Pool(2)
    try:
        workers = list(pool._pool)      # the two workers the tasks go to: watched for death
        try:
            pending = pool.map_async(answer, _ITEMS)
        except Exception as exc:        # refused before sending: say why
            return Verdict(False, f"A spawn Pool could not run {name} (defined in {where}) "
                                  f"over range(8): {type(exc).__name__}: {exc}")
        deadline = time.monotonic() + _TIME_LIMIT_S
        while not pending.ready():
            dead = [w for w in workers if w.exitcode is not None]
            if dead:                    # os._exit, a crash: the Pool would wait for ever
                return Verdict(False, f"A spawn Pool worker died (exit code {dead[0].exitcode}) "
                                      f"while running {name} over range(8): the task it held "
                                      f"is lost, and map would have waited for ever.")
            if time.monotonic() > deadline:
                return Verdict(False, f"{name} ran for more than {_TIME_LIMIT_S:g} s over "
                                      f"range(8) in a spawn Pool of 2 without finishing; "
                                      f"squaring 8 numbers takes milliseconds.")
            pending.wait(0.1)
        try:
            got = pending.get()
        except Exception as exc:        # raised in a worker: say which
            return Verdict(False, f"A spawn Pool could not run {name} (defined in {where}) "
                                  f"over range(8): {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        pool.terminate()
        pool.join()
        del pool
        gc.collect()            # a spawn pool's semaphores live in /dev/shm until collected
    want = [x * x for x in _ITEMS]
    if got != want:
        return Verdict(False, f"{name} ran in the spawn workers, but map gave {shown(got)}, "
                              f"not the squares {want}.")
    return Verdict(True, f"map over range(8) in a spawn Pool of 2 gave {got}. {name} lives in "
                         f"the module {where}, so each spawn worker imported it by name; a "
                         f"function defined in a notebook cell lives in the kernel's __main__, "
                         f"which a worker cannot import.")


@measured
def _owner():
    """Who holds the lock the forked child waits on: the holder's thread name and pid."""
    result = run("fork-held-lock")
    names = {(e.pid, e.tid): e.args.get("name") for e in result.trace.of_kind("thread.start")}
    for lock in result.trace.locks():
        waiters = {pid for pid, _tid, _ts in lock.waiting}
        for hold in lock.holds:
            if waiters - {hold.pid}:
                return names.get((hold.pid, hold.tid)), hold.pid, result
    raise RuntimeError("fork-held-lock recorded no lock held in one process and waited on in "
                       "another: the scenario itself changed")


@judged
def _judge_picture(answer):
    if not isinstance(answer, str):
        raise BadAnswer(f"the answer is the thread's name as a string, not {shown(answer)}")
    name, pid, result = _owner()
    right = str(name).lower() in answer.lower()   # "main's thread 'library-worker'" is right too
    return Verdict(right, (
        f"You said {shown(answer)}; the dashed owner is the parent's thread {name!r} (pid {pid}). "
        f"It held the lock when the main thread forked. The child got a copy of the lock, "
        f"still marked held, but not the thread: in the child no {name!r} exists, so nobody will ever "
        f"release the child's copy, and the child's wait is crimson, stuck for good."))


EXERCISES = [
    predict_outcome(
        "04.predict-small-item",
        "queue-join-deadlock with a 1 KiB item instead of 1 MiB (nbytes=1024), the parent "
        "still joining before it gets: will it be 'deadlock' or 'ok'?",
        "queue-join-deadlock", nbytes=1024),
    Exercise(
        "04.fix-spawn-pool", "fix",
        "A spawn Pool of 2 cannot run a function defined in this notebook. Give a function it "
        "can run that squares its argument, without defining anything here (hint: nw).",
        "a function, without calling it, e.g. nw.foo", _judge_fix),
    Exercise(
        "04.picture-owner", "picture",
        "In the wait-for graph of fork-held-lock, the owner of the child's lock is drawn "
        "dashed. What is that thread's name?",
        "the thread's name as a string", _judge_picture),
]
