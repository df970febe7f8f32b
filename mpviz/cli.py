"""``python -m mpviz``: the command line.

Every subcommand is one row of ``COMMANDS``, the table at the bottom of this module: its name,
a one-line help, ``add_arguments(parser)`` and ``run(args) -> exit status``. Adding one: write
those two functions (here, or in the module of what it runs) and add a row. (``register()`` adds
a row at run time, for an extension.)::

    python -m mpviz trace [-o DIR] [--hang-after S] [--plot | --no-plot] -- python script.py ...
                                          record an unmodified program (mpviz/trace/launcher.py)
    python -m mpviz trace --finish DIR    write the trace a killed launcher left unwritten
    python -m mpviz list [-v]             the teaching scenarios (mpviz/scenarios/cli.py)
    python -m mpviz run NAME [--param value ...]
                                          run one of them, print its verdict
    python -m mpviz shm                   mpviz's names in /dev/shm now, and what will become
                                          of each (held, in flight in a queue, leaked ...)

``main(argv=None)`` parses `argv` (default ``sys.argv[1:]``) and returns the subcommand's status.
"""
import argparse
import os
import sys

from .scenarios import cli as scenarios_cli


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
    try:
        status = COMMANDS[args.command][2](args)
        sys.stdout.flush()          # here, where a closed pipe can still be handled
        return status
    except BrokenPipeError:
        return _pipe_closed()


def _pipe_closed():
    """The reader of our output went away (``python -m mpviz list -v | head``): not an error,
    so no traceback; exit as a program killed by SIGPIPE would (128 + 13), as ``yes | head``
    does. stdout is pointed at /dev/null so that Python's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


# --- trace ----------------------------------------------------------------------------------

def _trace_arguments(parser):
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="trace directory, new or holding no recording (default: a new "
                             "mpviz-trace-* "
                             "directory in the current directory); refused before the program "
                             "starts if it cannot be written")
    parser.add_argument("--hang-after", metavar="S", type=float, default=10.0,
                        help="when a process can never move (every thread on a lock of its "
                             "own), or no thread moved for S seconds (a sleep or timeout that "
                             "ends within S is progress; input() is never a hang): capture "
                             "every process's Python stacks, print a verdict (DEADLOCK or "
                             "STALLED), end the program and exit 124 (default 10; 0 turns it "
                             "off; at least 0.5)")
    drawing = parser.add_mutually_exclusive_group()
    drawing.add_argument("--plot", dest="plot", action="store_const", const=True, default=None,
                         help="draw the timeline picture (default: only after a hang, a signal "
                              "or a non-zero exit status; drawing costs seconds: 3 s for a "
                              "240,000-event DataLoader run, docs/PERFORMANCE.md)")
    drawing.add_argument("--no-plot", dest="plot", action="store_const", const=False,
                         help="never draw (trace.json is always written)")
    parser.add_argument("--threading-locks", action="store_true",
                        help="also record threading.Lock/RLock made by the program")
    parser.add_argument("--finish", metavar="DIR",
                        help="run nothing: write trace.json (and, with --plot, the pictures) "
                             "from the logs in DIR, when the launcher that recorded them was "
                             "killed before it could")
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="the command to run, after --, e.g. -- python script.py")


def _trace_run(args):
    from mpviz.trace import launcher

    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if args.finish is not None:
        return _trace_finish(args, program)
    if not program:
        print("mpviz trace: give the program to run after --, e.g.\n"
              "    python -m mpviz trace -o out -- python script.py", file=sys.stderr)
        return 2
    try:
        return launcher.run(program, output=args.output, hang_after=args.hang_after,
                            plot=args.plot, threading_locks=args.threading_locks)
    except launcher.Refused as exc:
        launcher.say(str(exc))
        return 2


def _trace_finish(args, program):
    from mpviz.trace import launcher
    if program:
        launcher.say("--finish runs nothing: give either --finish DIR or a program after --")
        return 2
    try:
        return launcher.finish(args.finish, plot=args.plot)
    except launcher.Refused as exc:
        launcher.say(str(exc))
        return 2


# --- shm -------------------------------------------------------------------------------------

def _shm_arguments(parser):
    pass


def _shm_run(args):
    """Each file_system name of this user's runs in /dev/shm, its size, and its fate as the shm
    manager sees it (sharing/shm_manager.fates): held, in flight in a queue a live process can
    still read, unreachable (the manager removes it), or leaked. A name nobody holds is not
    always lost: this tells the learner which it is. Other users' names are counted, not
    judged: we cannot read them (and they are not ours to worry about)."""
    from mpviz.sharing import file_system, shm_manager
    prefix = file_system.PREFIX.lstrip("/")
    mine, others = [], {}
    for name in sorted(os.listdir("/dev/shm")):
        if not name.startswith(prefix) or name.startswith("mpviz_fd"):
            continue
        try:
            st = os.stat(os.path.join("/dev/shm", name))
        except OSError:
            continue                                  # gone while we looked
        if st.st_uid == os.getuid():
            mine.append((name, st.st_size))
        else:
            others[st.st_uid] = others.get(st.st_uid, 0) + 1
    if not mine:
        print(f"no mpviz segments of yours in /dev/shm (names {prefix}*)")
    if len(mine) > 100:
        print(f"{len(mine):,} segments of yours; asking the shm manager and reading /proc once "
              f"for all of them...", flush=True)
    fates = shm_manager.fates(["/" + name for name, _ in mine])
    leaked = []
    for name, size in mine:
        kind, words = fates["/" + name]
        print(f"/dev/shm/{name}  {size:,} bytes  {kind.upper()}: {words}")
        if kind == "leaked":
            leaked.append(f"/dev/shm/{name}")
    if leaked:
        paths = " ".join(leaked) if len(leaked) <= 5 else "each LEAKED path above"
        print(f"{len(leaked):,} LEAKED segment(s): no process can ever use them again, and "
              f"they hold RAM until removed. Fix: rm {paths} (or let a shm manager start when "
              f"none runs: it adopts the names it finds, and removes these)")
    for uid, count in sorted(others.items()):
        print(f"(and {count:,} mpviz segment(s) of uid {uid}: not yours, left out)")
    return 0


# --- the subcommands: name -> (one-line help, add_arguments(parser), run(args)) -------------

COMMANDS = {
    "trace": ("record an unmodified Python program, its child processes included",
              _trace_arguments, _trace_run),
    "list": ("list the teaching scenarios and their parameters",
             scenarios_cli.list_arguments, scenarios_cli.list_command),
    "run": ("run one teaching scenario and print its verdict",
            scenarios_cli.run_arguments, scenarios_cli.run_command),
    "shm": ("mpviz's names in /dev/shm now, and what will become of each",
            _shm_arguments, _shm_run),
}
