"""Exercises of notebook 07 (mp.spawn and errors): run the real spawn, time the real failure."""
import os
import signal
import time

from .. import multiprocessing as mp
from ..examples import notebook_workers_2 as nw
from .base import BadAnswer, Exercise, Verdict, as_number, judged, measured, shown

# the fix exercise: rank 1 raises at once, ranks 0 and 2 work this long unless stopped
_WORK_S = 8.0
_IN_TIME_S = 5.0
_TIME_LIMIT_S = 20.0         # then the learner's function is stopped: it hangs


@measured
def _exit_with_3():
    """What mp.spawn(nw.exit_with, args=(3,), nprocs=2) really raises."""
    try:
        mp.spawn(nw.exit_with, args=(3,), nprocs=2)
    except mp.ProcessException as exc:
        return type(exc).__name__, getattr(exc, "exit_code", None), \
            getattr(exc, "signal_name", None)
    return None, None, None


@judged
def _judge_predict(answer):
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        raise BadAnswer(f"the answer is a triple: (the exception's name, exit_code, "
                        f"signal_name), e.g. ('ValueError', 0, 'SIGINT'), not {shown(answer)}")
    kind, code, signal_name = answer
    if isinstance(kind, type):
        kind = kind.__name__
    real = _exit_with_3()
    parts = []
    for what, said, was in zip(("the exception", "exit_code", "signal_name"),
                               (kind, code, signal_name), real):
        parts.append(f"{what}: {was!r}" + ("" if said == was else f" (you said {said!r})"))
    why = (f"mp.spawn(nw.exit_with, args=(3,), nprocs=2) raised just now with "
           f"{'; '.join(parts)}. The children called sys.exit(3): no exception inside them, so "
           f"nothing in the error pipe and no traceback; spawn saw an exit code other than 0 "
           f"and raised ProcessExitedException with that code. No signal killed them, so "
           f"signal_name is None.")
    return Verdict((kind, code, signal_name) == real, why)


def _run_answer(answer, send):
    """In a forked child, in a process group of its own: run the learner's function and send
    back what happened. Whatever it does (os._exit, a hang), the parent can kill the group."""
    os.setpgrp()
    start = time.monotonic()
    try:
        answer()
        outcome = ("returned", None)
    except mp.ProcessRaisedException as exc:
        outcome = ("raised", exc.error_index)
    except BaseException as exc:                 # the learner's own mistake: say which
        outcome = ("other", f"{type(exc).__name__}: {str(exc)[:300]}")
    took = time.monotonic() - start
    left = [p.name for p in mp.active_children()]
    send.send((outcome, took, left))
    for p in mp.active_children():
        p.kill()


def _in_a_child(answer):
    """Run ``answer()`` in a forked child with a time limit: (outcome, seconds, children left
    running), or a str that says how the child ended without telling."""
    receive, send = mp.get_context("fork").Pipe(duplex=False)
    child = mp.get_context("fork").Process(target=_run_answer, args=(answer, send),
                                           name="check-07")
    child.start()
    send.close()
    try:
        if not receive.poll(_TIME_LIMIT_S):
            return (f"Your function was still running after {_TIME_LIMIT_S:g} s: the parent "
                    f"never heard that rank 1 failed.")
        try:
            return receive.recv()
        except EOFError:
            child.join(5)
            return (f"Your function ended the process that ran it (exit code {child.exitcode}) "
                    f"before it returned or raised: the parent was gone, not informed.")
    finally:
        receive.close()
        try:
            os.killpg(child.pid, signal.SIGKILL)  # the child and any rank it left behind
        except (ProcessLookupError, PermissionError):
            pass
        child.join()


@judged
def _judge_fix(answer):
    if not callable(answer):
        raise BadAnswer(f"the answer is your function (its name, without calling it), not "
                        f"{shown(answer)}")
    ran = _in_a_child(answer)
    if isinstance(ran, str):
        return Verdict(False, ran)
    (how, what), took, left = ran
    if how == "other":
        return Verdict(False, f"Your function raised {what}")
    raised = how == "raised"
    if not raised:
        return Verdict(False, f"Your function returned after {took:.1f} s without raising: the "
                              f"parent never learned, as an exception, that rank 1 failed.")
    if what != 1:
        return Verdict(False, f"It raised about rank {what}, not rank 1.")
    if took > _IN_TIME_S or left:
        return Verdict(False, f"It raised about rank 1 after {took:.1f} s"
                              + (f", and left {left} running" if left else "")
                              + f": the parent should hear within {_IN_TIME_S:g} s and stop "
                                f"the others.")
    return Verdict(True, f"ProcessRaisedException from rank 1 after {took:.1f} s, not after "
                         f"the {_WORK_S:g} s the other ranks would have worked, and no child "
                         f"left running: spawn waited on all ranks at once, terminated the "
                         f"others and raised with rank 1's traceback.")


@measured
def _by_hand_wait():
    """Run notebook 07's by-hand program (rank 1 raises at once, the others work 2 s, joined in
    order) under a recording: seconds from rank 1's exit to the parent's mark."""
    from .. import trace as mt
    ctx = mp.get_context("spawn")
    with mt.record() as rec:
        procs = [ctx.Process(target=nw.fail_on, args=(rank, 1, 2.0), name=f"rank-{rank}")
                 for rank in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        mt.mark("parent sees rank 1's exit code")
    exits = [e.ts_ns for e in rec.of_kind("process.exit") if e.pid == procs[1].pid]
    seen = [e.ts_ns for e in rec.of_kind("mark")
            if e.args.get("name") == "parent sees rank 1's exit code"]
    if not exits or not seen:
        raise RuntimeError("the by-hand run recorded no exit of rank 1 or no mark: "
                           "mpviz's recording itself failed")
    return (seen[0] - exits[0]) / 1e9


@judged
def _judge_picture(answer):
    said = as_number(answer, "a number of seconds")
    waited = _by_hand_wait()
    margin = max(0.75, 0.3 * waited)
    return Verdict(abs(said - waited) <= margin, (
        f"You read {said:g} s; in a run of the same program just now the parent's mark came "
        f"{waited:.1f} s after rank 1's lane ended (within {margin:.2f} s counts as right). Rank 1 "
        f"died as soon as it started, but the parent was blocked in procs[0].join() until "
        f"rank 0 had worked its 2 s: only then did it look at rank 1."))


EXERCISES = [
    Exercise(
        "07.predict-exit", "predict",
        "nw.exit_with(rank, code) calls sys.exit(code). What does mp.spawn(nw.exit_with, "
        "args=(3,), nprocs=2) raise, and with which exit_code and signal_name?",
        "a triple: (the exception's name as a string, exit_code, signal_name)", _judge_predict),
    Exercise(
        "07.fix-hear-early", "fix",
        f"Fix the by-hand loop: write a function, taking no arguments, that runs nw.fail_on on "
        f"ranks 0, 1 and 2 with args (1, {_WORK_S:g}) (rank 1 raises at once, the others work "
        f"{_WORK_S:g} s) so that the parent hears about rank 1, as an exception, within "
        f"{_IN_TIME_S:g} s, and no rank is left running.",
        "your function, without calling it", _judge_fix),
    Exercise(
        "07.picture-late-news", "picture",
        "On the by-hand timeline (drawn at true time), about how many seconds passed between "
        "the end of rank 1's lane and the parent's mark \"parent sees rank 1's exit code\"?",
        "a number of seconds", _judge_picture),
]
