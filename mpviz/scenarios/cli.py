"""``python -m mpviz list`` and ``python -m mpviz run NAME [--param value ...]``.

    python -m mpviz list                                  the catalog, with parameters
    python -m mpviz run fs-leak --manager off             run one case, print its verdict
    python -m mpviz run fork-held-lock --plot t.png --trace out/

``run`` exits 0 when the case ran (whatever its lesson's outcome: an ``error`` or a
``deadlock`` *is* the lesson), 1 when mpviz itself failed to run it, 2 for bad usage.
mpviz/cli.py's table of subcommands names these functions; this module does not import it.
"""
import argparse
import os
import sys
import textwrap


def list_arguments(parser):
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show each parameter's help")


def list_command(args):
    from . import catalog
    for info in catalog():
        print(f"{info.name:22s} {info.summary}")
        for key, param in info.params.items():
            choices = f" {param.choices}" if param.choices else ""
            print(f"{'':24s}--{key.replace('_', '-')} (default {param.default!r}){choices}")
            if args.verbose:
                print(textwrap.fill(param.help, 96, initial_indent=" " * 28,
                                    subsequent_indent=" " * 28))
    return 0


def run_arguments(parser):
    parser.add_argument("name", help="scenario name (see `python -m mpviz list`)")
    parser.add_argument("options", nargs=argparse.REMAINDER, metavar="--param value",
                        help="scenario parameters, e.g. --strategy file_system; also "
                             "--plot OUT.png (draw the timeline) and --trace DIR (keep the "
                             "trace there)")


def parse_options(tokens):
    """['--a', '1', '--b=x', '--plot', 'p.png'] -> ({'a': '1', 'b': 'x'}, plot, trace)."""
    params, plot, trace_dir = {}, None, None
    tokens = list(tokens)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ValueError(f"expected --name value, got {tok!r}")
        key, eq, value = tok[2:].partition("=")
        if not eq:
            if i + 1 >= len(tokens):
                raise ValueError(f"--{key} needs a value")
            value = tokens[i + 1]
            i += 1
        i += 1
        key = key.replace("-", "_")
        if key == "plot":
            plot = value
        elif key == "trace":
            trace_dir = value
        else:
            params[key] = value
    return params, plot, trace_dir


def run_command(args):
    from . import start
    try:
        params, plot, trace_dir = parse_options(args.options)
        if plot:
            _check_writable(plot)          # before the run, not after it
        running = start(args.name, trace_dir=trace_dir, **params)
    except (ValueError, OSError) as exc:
        print(f"mpviz run: {exc}", file=sys.stderr)
        return 2
    tty = sys.stderr.isatty()
    last = 0.0
    while not running.done():
        try:
            running.result(timeout=0.5)
        except TimeoutError:
            pass
        except KeyboardInterrupt:
            print("\nmpviz run: interrupted; stopping the run and cleaning up", file=sys.stderr)
            running.stop()
            return 130
        seconds, events = running.progress()
        if not running.done() and seconds - last >= (0.5 if tty else 2.0):
            last = seconds
            line = f"  ... {running.name}: {seconds:4.1f} s, {events} events"
            print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr,
                  flush=True)
    if tty and last:
        print(file=sys.stderr)
    result = running.result()
    shown = " ".join(f"{k}={v}" for k, v in result.params.items())
    print(f"{result.name} [{shown}]: {result.outcome.upper()} ({result.duration_s:.1f} s)")
    print()
    for para in result.explanation.split("\n\n"):
        if para.startswith("Where the stuck") or "\n  pid " in para:
            print(para)
        else:
            print(textwrap.fill(para, 100))
        print()
    if trace_dir:
        print(f"trace: {os.path.abspath(trace_dir)} (mpviz.trace.load() reads it)")
    if plot and not _plot(result, plot):
        return 1
    if result.problem:
        print(f"mpviz run: mpviz failed to run {result.name!r} (see above); its output:\n"
              f"{result.output[-3000:]}", file=sys.stderr)
        return 1
    return 0


def _check_writable(path):
    """Raise ValueError (one line: what, why, fix) if a picture cannot be saved at `path`."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise ValueError(f"--plot {path!r} is a directory. Fix: give a file name, e.g. "
                         f"--plot {os.path.join(path, 'timeline.png')}")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        why = "does not exist" if not os.path.isdir(folder) else "is not writable"
        raise ValueError(f"cannot save --plot {path!r}: the folder {folder!r} {why}. Fix: "
                         f"give a path in a folder you can write, e.g. --plot timeline.png")
    extension = os.path.splitext(path)[1][1:].lower()
    if extension:
        try:
            from matplotlib.backend_bases import FigureCanvasBase
        except ImportError:              # (_plot says so, after the run)
            return
        formats = sorted(FigureCanvasBase.get_supported_filetypes())
        if extension not in formats:
            raise ValueError(f"cannot save --plot {path!r}: {extension!r} is not a picture "
                             f"format matplotlib can write ({', '.join(formats)}); refused "
                             f"before the run, which was not started. Fix: --plot "
                             f"{os.path.splitext(path)[0]}.png")


def _plot(result, path):
    """Save the timeline; False (after one line) if it could not be drawn or saved."""
    try:
        from mpviz.viz import timeline
    except ImportError as exc:
        print(f"mpviz run: error: cannot draw {path}: {exc} in this Python ({sys.executable}). "
              f"The verdict above stands. Fix: run it in the project's environment, "
              f"`./run mpviz run ... --plot {path}`, or install matplotlib.", file=sys.stderr)
        return False
    try:
        timeline(result.trace).savefig(path)
    except (OSError, ValueError) as exc:      # a full disk, an unknown picture format
        print(f"mpviz run: cannot save {path}: {exc}. The verdict above stands.",
              file=sys.stderr)
        return False
    print(f"timeline: {os.path.abspath(path)}")
    return True
