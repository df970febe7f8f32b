"""Exercises of notebook 14 (debugging child processes): each runs real processes.

    14.predict-spawn-logging   a spawned child logs INFO and WARNING after the parent's
                               basicConfig(level=INFO): a fresh Python runs, and we read its stderr
    14.fix-orphan              a stand-in parent is SIGKILLed: does its child outlive it?
    14.picture-stack           a stuck child's stack, written by faulthandler: which function?
"""
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile

from ..examples import debugging
from .base import BadAnswer, Exercise, Verdict, describe, judged, measured, shown

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# what the predict exercise runs: a parent script that configures logging, then spawns
_LOGGING_SCRIPT = """
import logging, multiprocessing as mp
from mpviz.examples.debugging import log_both
if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    logging.info("parent: an INFO message")
    child = mp.get_context("spawn").Process(target=log_both, args=("child",))
    child.start()
    child.join()
"""


@measured
def _spawned_child_logs():
    """The levels of the child's lines in the real run's stderr, and the lines themselves."""
    with tempfile.TemporaryDirectory(prefix="mpviz-nb14-") as where:
        script = os.path.join(where, "parent.py")
        with open(script, "w") as f:
            f.write(_LOGGING_SCRIPT)
        done = subprocess.run([sys.executable, script], capture_output=True, text=True,
                              timeout=60, cwd=where)
    lines = [line for line in done.stderr.splitlines() if "child:" in line]
    levels = [level for level in LEVELS for line in lines if line.startswith(level + ":")]
    return levels, lines


@judged
def _judge_logging(answer):
    if not isinstance(answer, (list, tuple, set)) or \
            not all(isinstance(a, str) for a in answer):
        raise BadAnswer(f"the answer is a list of level names, e.g. ['INFO'] or [] for none, "
                        f"not {shown(answer)}")
    said = {a.strip().upper() for a in answer}
    unknown = said - set(LEVELS)
    if unknown:
        raise BadAnswer(f"{', '.join(sorted(unknown))} is not a logging level; the levels "
                        f"are {', '.join(LEVELS)}")
    levels, lines = _spawned_child_logs()
    shown_lines = "; ".join(lines) or "nothing"
    why = (f"You said {sorted(said) or 'none'}; the spawned child's stderr just now held: "
           f"{shown_lines}. A spawned child is a fresh Python: it imports your module but runs "
           f"none of the parent's setup, so its root logger has no handler and the level "
           f"WARNING. logging.info() was dropped; logging.warning() found no handler, called "
           f"basicConfig() itself, and wrote to the child's stderr, which is the parent's. "
           f"Configure logging in the child (or send its records to the parent: "
           f"QueueHandler).")
    return Verdict(said == set(levels), why)


_ORPHAN_KEYS = {"daemon": bool, "own_session": bool, "pdeathsig": bool, "method": str}


def _orphan_params(answer):
    if not isinstance(answer, dict):
        raise BadAnswer(f"a fix is a dict of the child's options, e.g. {{'daemon': True}}; "
                        f"the options are {', '.join(_ORPHAN_KEYS)}; not {shown(answer)}")
    for key, value in answer.items():
        if key not in _ORPHAN_KEYS:
            raise BadAnswer(f"{shown(key)} is not an option of the child; the options are "
                            f"{', '.join(_ORPHAN_KEYS)}")
        if not isinstance(value, _ORPHAN_KEYS[key]):
            raise BadAnswer(f"{key} is a {_ORPHAN_KEYS[key].__name__}, not {shown(value)}")
    if answer.get("method", "fork") not in multiprocessing.get_all_start_methods():
        raise BadAnswer(f"method is one of {', '.join(multiprocessing.get_all_start_methods())}, "
                        f"not {shown(answer['method'])}")
    return dict(answer)


@judged
def _judge_orphan(answer):
    params = _orphan_params(answer)
    where = tempfile.mkdtemp(prefix="mpviz-nb14-")
    try:
        case = debugging.orphan_case(os.path.join(where, "notes"), kill="parent", **params)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if case["alive"] and case["ppid_before"] != case["parent"]:
        return Verdict(False, (
            f"With {describe(params)} the child (pid {case['child']}) was still running a "
            f"second after the program that asked for it was SIGKILLed. Its parent was never "
            f"that program: under forkserver the fork server (pid {case['ppid_before']}) forks "
            f"each child, and it was still its parent after the kill: the fork server stays "
            f"alive while any child it made lives (each child holds the pipe whose end tells it "
            f"to exit). So the program's death tells the child nothing, and PR_SET_PDEATHSIG, "
            f"which watches the child's parent, watches the fork server. Start the child with "
            f"fork or spawn, and ask for the signal."))
    if case["alive"]:
        return Verdict(False, (
            f"With {describe(params)} the child (pid {case['child']}) was still running a "
            f"second after its parent was SIGKILLed; its parent is now pid "
            f"{case['ppid_after']} (it was {case['ppid_before']}): an orphan. A SIGKILLed "
            f"parent runs no more code, so nothing it would have done at exit (terminating "
            f"daemon children) happens; and a kill of one pid signals nobody else. Only the "
            f"kernel can tell the child: ask it to, from the child."))
    return Verdict(True, (
        f"With {describe(params)} the child (pid {case['child']}) ended with its parent: the "
        f"kernel sent it the signal it asked for with prctl(PR_SET_PDEATHSIG) when its parent "
        f"died, whatever killed the parent. mpviz.multiprocessing.spawn arms it in each child "
        f"(with SIGINT)."))


@measured
def _innermost_function():
    """The innermost frame in debugging.py of a stuck child's faulthandler dump."""
    where = tempfile.mkdtemp(prefix="mpviz-nb14-")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=debugging.stuck_in_get,
                        args=(queue, os.path.join(where, "stack.txt"), 10.0))
    child.start()
    try:
        text = debugging.wait_for_dump(os.path.join(where, "stack.txt"), 10.0, child)
    finally:
        queue.put(None)
        child.join(15)
        if child.is_alive():
            child.kill()
            child.join()
        queue.close()
        queue.join_thread()
        shutil.rmtree(where, ignore_errors=True)
    found = re.findall(r'File ".*debugging\.py", line \d+ in (\w+)', text)
    return (found[0] if found else None), text


@judged
def _judge_stack(answer):
    if not isinstance(answer, str):
        raise BadAnswer(f"the answer is a function's name as a string, e.g. 'main', "
                        f"not {shown(answer)}")
    name = answer.strip().removesuffix("()")
    real, _ = _innermost_function()
    why = (f"You said {shown(answer)}; in the stack faulthandler wrote just now, the first line "
           f"in debugging.py (the innermost of its frames: faulthandler prints the most recent "
           f"call first) is in {real}(). The lines above it are the library's (queues.py's get, "
           f"connection.py's poll, selectors' select): the child is inside Queue.get, called "
           f"by {real}. Read from the top to where the library ends and your code begins.")
    return Verdict(name == real, why)


EXERCISES = [
    Exercise(
        "14.predict-spawn-logging", "predict",
        "The parent runs logging.basicConfig(level=logging.INFO), then starts a spawn child "
        "that calls logging.info(...) and then logging.warning(...). Which of the child's two "
        "messages are written anywhere (to the cell, a terminal, a file)?",
        "a list of level names, e.g. ['INFO'] (or [] for none)", _judge_logging),
    Exercise(
        "14.fix-orphan", "fix",
        "The stand-in parent starts one child (fork) and is then SIGKILLed, as a kernel killed "
        "by the OOM killer is. Give the child's options under which it does not outlive its "
        "parent.",
        "a dict of the child's options: daemon, own_session, pdeathsig (True/False), method",
        _judge_orphan),
    Exercise(
        "14.picture-stack", "picture",
        "Read the stack that faulthandler wrote for the stuck child: in which function of "
        "mpviz/examples/debugging.py was the child (the innermost of that file's frames)?",
        "a function's name as a string, e.g. 'main'", _judge_stack),
]
