"""The first process of a stepped run (``python -m mpviz.stepper._driver RUN_DIR``).

    RUN_DIR/run.pickle   what to run: ("function", f, args, kwargs) or ("puzzle", name, params)
    RUN_DIR/trace/       the recording (every process of the run records into it, as usual)
    RUN_DIR/details.json what the program observed (a puzzle's drive(p, details) writes it)

It is started by the Stepper (control.py) in a session of its own, so that everything it starts
can be found and ended. Its ``__main__`` is this importable module, so spawn children work even
when the Stepper lives in a notebook kernel. It steps itself (gate.activate) before anything else,
then records the run (threading locks too: a library's lock is a threading.Lock).
"""
import os
import pickle
import sys
import traceback


def main(run_dir):
    from mpviz import trace
    from mpviz.scenarios._common import Details
    from mpviz.stepper import gate

    with open(os.path.join(run_dir, "run.pickle"), "rb") as f:
        what = pickle.load(f)
    details = Details(os.path.join(run_dir, "details.json"))
    gate.activate()
    status = 0
    with trace.record(os.path.join(run_dir, "trace"), threading_locks=True):
        try:
            if what[0] == "function":
                _, function, args, kwargs = what
                result = function(*args, **kwargs)
                details["result"] = repr(result)[:200]
            else:
                from mpviz.scenarios import puzzles
                _, name, params = what
                puzzles.PUZZLES[name].drive(params, details)
        except BaseException:
            details["error"] = traceback.format_exc()
            print(details["error"], file=sys.stderr)
            status = 1
    details["finished"] = True
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
