"""``python -m mpviz``: the command line.

Subcommands live in a registry, so adding one is three steps: write ``add_arguments(parser)`` and
``run(args) -> exit status``, then call ``register("name", "one-line help", add_arguments, run)``
at the bottom of this module (or from another module imported here)::

    python -m mpviz trace [-o DIR] -- python script.py args...   record an unmodified program

``main(argv=None)`` parses `argv` (default ``sys.argv[1:]``) and returns the subcommand's status.
"""
import argparse
import os
import subprocess
import sys
import tempfile

COMMANDS = {}     # name -> (help, add_arguments, run)


def register(name, help, add_arguments, run):
    """Add a subcommand: `add_arguments(parser)` declares its options, `run(args)` runs it."""
    if name in COMMANDS:
        raise ValueError(f"subcommand {name!r} is already registered")
    COMMANDS[name] = (help, add_arguments, run)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m mpviz",
                                     description="See what multiprocessing does.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, add_arguments, _run) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help, description=help))
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command is None:
        parser.print_help()
        return 2
    return COMMANDS[args.command][2](args)


# --- trace ----------------------------------------------------------------------------------

def _trace_arguments(parser):
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="trace directory (default: a new mpviz-trace-* directory in the "
                             "current directory)")
    parser.add_argument("--threading-locks", action="store_true",
                        help="also record threading.Lock/RLock made by the program")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="the command to run, after --, e.g. -- python script.py")


def _trace_run(args):
    from mpviz.trace import autostart, load, recorder

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if not program:
        print("mpviz trace: give the program to run after --, e.g.\n"
              "    python -m mpviz trace -o out -- python script.py", file=sys.stderr)
        return 2
    directory = os.path.abspath(args.output or tempfile.mkdtemp(prefix="mpviz-trace-", dir="."))
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        [autostart.site_directory(), root] + [p for p in [env.get("PYTHONPATH")] if p])
    env[autostart.ENV_DIR] = directory
    if args.threading_locks:
        env[autostart.ENV_THREADING_LOCKS] = "1"
    # This launcher records too (as the program's parent), so that the trace shows how the
    # program ended even if it was killed.
    recording = recorder.start(directory, "launcher")
    try:
        child = subprocess.Popen(program, env=env)
    except OSError as exc:
        recorder.stop()
        print(f"mpviz trace: cannot run {program[0]!r}: {exc}", file=sys.stderr)
        return 127
    if recording:
        recorder.emit("process.launch", child=child.pid, name=" ".join(program),
                      start_method="exec")
    try:
        code = child.wait()
    except KeyboardInterrupt:        # the program got the Ctrl-C too; wait for it to finish
        code = child.wait()
    if recording:
        import signal
        sig = signal.Signals(-code).name if code < 0 else None
        recorder.emit("process.reaped", child=child.pid, exitcode=code, signal=sig)
        recorder.stop()
    trace = load(directory)
    chrome = os.path.join(directory, "trace.json")
    trace.to_chrome(chrome)
    print(f"mpviz trace: {len(trace.events)} events from {len(trace.processes())} processes "
          f"in {directory}\nmpviz trace: Chrome/Perfetto JSON: {chrome} "
          f"(open it at https://ui.perfetto.dev)", file=sys.stderr)
    picture = _try_plot(trace, directory)
    if picture:
        print(f"mpviz trace: timeline picture: {picture}", file=sys.stderr)
    return code if code >= 0 else 128 - code


def _try_plot(trace, directory):
    """Draw the timeline if mpviz.viz (and matplotlib) are there; the trace is enough without."""
    try:
        fig = trace.plot()
        path = os.path.join(directory, "timeline.png")
        fig.savefig(path)
        return path
    except Exception:
        return None


register("trace", "record an unmodified Python program, its child processes included",
         _trace_arguments, _trace_run)

from mpviz.scenarios import cli as _scenarios_cli  # noqa: E402,F401 - registers list and run
