"""The driver: one fresh interpreter per scenario run (``python -m mpviz.scenarios._driver``).

    python -m mpviz.scenarios._driver NAME JSON_PARAMS TRACE_DIR

It records into TRACE_DIR (``mpviz.trace.record``) while the case's ``drive(p, details)`` runs,
and saves what the case observed in ``TRACE_DIR/details.json``. It is started by
``runner.Running`` in a session of its own, so that everything it starts can be found and killed.
Why a fresh interpreter: its ``__main__`` is this importable module, so spawn children work even
when the caller is a notebook kernel; and a case that hangs or crashes takes only itself down.
An exception escaping ``drive`` is a failure of mpviz itself (the cases catch the errors they
teach): it is saved as ``details["driver_error"]`` and the exit status is 3.
"""
import json
import os
import sys
import traceback


def main(argv):
    name, params, directory = argv[0], json.loads(argv[1]), argv[2]
    import mpviz.scenarios as scenarios
    from mpviz import trace
    from mpviz.scenarios._common import Details

    case = scenarios.module(name)
    details = Details(os.path.join(directory, "details.json"))
    details["driver_pid"] = os.getpid()
    details["params"] = params
    status = 0
    with trace.record(directory, threading_locks=getattr(case, "THREADING_LOCKS", False)):
        trace.mark("scenario.start", scenario=name, params=params)
        try:
            case.drive(params, details)
        except BaseException:
            details["driver_error"] = traceback.format_exc()
            print(f"mpviz.scenarios: the driver of {name!r} failed:\n{details['driver_error']}",
                  file=sys.stderr)
            status = 3
        trace.mark("scenario.end", scenario=name)
    details["finished"] = True
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
