"""docs/TOUR.md stays true: every step names a function that is in its file, every module header
that promises a tour ("in ten files") names one of its tours and counts its files alike, and a
real put and get (under each strategy) call the put → get steps in the tour's order, and a real
mark, read back and drawn, goes through the mark tour's steps.

Read by ``ast``, not imported: a step names where the code is written, and a function that moved
to another file fails here even if the old module still re-exports it. The path is followed with
``sys.setprofile`` (each call into mpviz's code, on the calling thread).
"""
import ast
import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "TOUR.md"

STEP = re.compile(r"^(\d+)\. `([^`:]+):([\w.]+)` — (\S.*)$")
PROMISE = re.compile(r"\bin (\w+) files\b")
NUMBERS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}


def tours(text):
    """{title: [(number, path, function, what it does)]} of the tours in `text` (TOUR.md).
    A numbered line that is not a well-formed step is an error, not skipped."""
    found, title = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            found[title] = []
        elif re.match(r"^\d+\.", line):
            step = STEP.match(line)
            assert step and title, (
                f"TOUR.md: {line!r} is not a step under a '## ' tour: a step is one line, "
                f"'N. `path/to/file.py:function` — what it does there'. Fix: write it so")
            n, path, function, what = step.groups()
            found[title].append((int(n), path, function, what))
    return {t: steps for t, steps in found.items() if steps}


def defined(path, dotted):
    """Whether `dotted` ("f", "Class.method") is defined in the Python file `path`."""
    body = ast.parse(path.read_text(), str(path)).body
    for part in dotted.split("."):
        node = next((n for n in body if isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return False
        body = node.body
    return True


def wrong_steps(tour_map):
    """Every step whose file or function is not there, in words."""
    wrong = []
    for title, steps in tour_map.items():
        numbers = [n for n, *_ in steps]
        if numbers != list(range(1, len(steps) + 1)):
            wrong.append(f"{title}: steps numbered {numbers}, not 1..{len(steps)}")
        for n, path, function, _ in steps:
            file = ROOT / path
            if not file.is_file():
                wrong.append(f"{title}, step {n}: {path} is not a file")
            elif not defined(file, function):
                wrong.append(f"{title}, step {n}: {path} defines no {function}")
    return wrong


def files_in(steps):
    return {path for _, path, _, _ in steps}


def promises():
    """[(module path, the number of files its header promises, its header)] for every module
    of mpviz whose header says "in N files"."""
    out = []
    for path in sorted((ROOT / "mpviz").rglob("*.py")):
        header = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        for word in PROMISE.findall(header):
            out.append((path.relative_to(ROOT), NUMBERS.get(word, word), " ".join(header.split())))
    return out


def test_the_tour_has_its_three_tours_each_a_walk_through_several_files():
    found = tours(TOUR.read_text())
    assert set(found) >= {"put → get under file_descriptor", "put → get under file_system",
                          'mark("x") → the picture'}, sorted(found)
    for title, steps in found.items():
        assert len(files_in(steps)) >= 3, f"{title}: {steps}"


def test_every_step_names_a_function_that_is_in_its_file():
    wrong = wrong_steps(tours(TOUR.read_text()))
    assert not wrong, ("docs/TOUR.md names code that is not where it says:\n  " + "\n  ".join(wrong)
                       + "\nFix: point the step at the file and function the call goes to now")


def test_the_step_check_finds_a_function_that_moved():
    moved = tours("## t\n1. `mpviz/multiprocessing/queues.py:encode` — encode is imported here, "
                  "not written here\n2. `mpviz/nowhere.py:f` — no such file\n"
                  "4. `mpviz/multiprocessing/queues.py:Queue.put` — numbered after a gap\n")
    wrong = wrong_steps(moved)
    assert len(wrong) == 3 and "defines no encode" in wrong[1], wrong
    assert defined(ROOT / "mpviz/multiprocessing/queues.py", "Queue.get")


def test_every_header_that_promises_a_tour_names_it_and_counts_its_files_as_it_does():
    found = tours(TOUR.read_text())
    promised = promises()
    assert len(promised) >= 2, f"the headers of queues.py and trace/__init__.py promise tours: {promised}"
    wrong = []
    for path, count, header in promised:
        named = [t for t in found if " ".join(t.split()) in header]
        if not named:
            wrong.append(f"{path} promises a tour in {count} files but names none of TOUR.md's "
                         f"{sorted(found)}")
        for title in named:
            if len(files_in(found[title])) != count:
                wrong.append(f"{path} says {count} files; TOUR.md's {title!r} walks through "
                             f"{len(files_in(found[title]))}: {sorted(files_in(found[title]))}")
    assert not wrong, ("\n".join(wrong) + "\nFix: make the header's count what the tour walks "
                       "through (or shorten the real path, and the tour with it)")


# --- the put → get tours are the path a real put and get take, in order ------------------------

def _calls_in_mpviz(fn, *args):
    """(what fn returned, [(path, function)]): each call into mpviz's own code made by `fn` on
    this thread, in order, as TOUR.md names a step (a function's qualified name)."""
    seen = []

    def note(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(ROOT / "mpviz") + os.sep):
            seen.append((str(pathlib.Path(frame.f_code.co_filename).relative_to(ROOT)),
                         frame.f_code.co_qualname))

    sys.setprofile(note)
    try:
        return fn(*args), seen
    finally:
        sys.setprofile(None)


def _get_and_tell(q, told):
    tensor, calls = _calls_in_mpviz(q.get)
    told.put((tensor.tolist(), calls))


def _steps_missing_or_out_of_order(steps, calls):
    """The first step not found, in the tour's order, among `calls`, in words ([] when the tour
    is the path taken; the steps after a wrong one are not looked at)."""
    at = 0
    for n, path, function, _ in steps:
        try:
            at = calls.index((path, function), at) + 1
        except ValueError:
            where = ("not called" if (path, function) not in calls else
                     f"not called after step {n - 1}")
            return [f"step {n} {path}:{function}: {where}"]
    return []


@pytest.mark.timeout(60)
def test_each_put_get_tour_is_the_path_a_real_put_and_get_take_in_its_order(strategy):
    # a step whose function exists but is not on the way (or comes in another order) passes
    # the check above; this one follows a real put in this process and a real get in a child
    import mpviz
    import mpviz.multiprocessing as mp
    steps = tours(TOUR.read_text())[f"put → get under {strategy}"]
    ctx = mp.get_context("fork")             # forked before the put: the child maps nothing yet
    q, told = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_get_and_tell, args=(q, told))
    child.start()
    _, put_calls = _calls_in_mpviz(q.put, mpviz.arange(4.0))
    got, get_calls = told.get(timeout=30)
    child.join(30)
    assert got == [0.0, 1.0, 2.0, 3.0] and child.exitcode == 0
    at_get = next(i for i, step in enumerate(steps) if step[2] == "Queue.get")
    wrong = (_steps_missing_or_out_of_order(steps[:at_get], put_calls)
             or _steps_missing_or_out_of_order(steps[at_get:], get_calls))
    assert not wrong, (f"docs/TOUR.md's 'put → get under {strategy}' is not the path a put and "
                       f"a get take:\n  " + "\n  ".join(wrong) + "\nFix: name the functions the "
                       f"call goes through now, in the order it calls them")


def test_the_path_check_finds_a_step_out_of_order_and_one_never_called():
    calls = [("a.py", "f"), ("b.py", "g"), ("a.py", "h")]
    steps = [(1, "a.py", "f", ""), (2, "a.py", "h", ""), (3, "b.py", "g", ""), (4, "c.py", "k", "")]
    assert _steps_missing_or_out_of_order(steps, calls) == [
        "step 3 b.py:g: not called after step 2"]
    assert _steps_missing_or_out_of_order(steps[:2] + steps[3:], calls) == [
        "step 4 c.py:k: not called"]
    assert _steps_missing_or_out_of_order(steps[:2], calls) == []


@pytest.mark.timeout(60)
def test_the_mark_tour_is_the_path_a_real_mark_takes_to_its_tick(monkeypatch, tmp_path):
    # the mark tour follows the event (written, read back, merged, drawn), so its reading steps
    # are checked as called, and the drawing steps in their order: the picture's own calls
    import mpviz.trace as mt
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1")   # the Python Writer (writer.c is a side trip)
    steps = tours(TOUR.read_text())['mark("x") → the picture']
    at_plot = next(i for i, step in enumerate(steps) if step[2] == "Trace.plot")
    with mt.record(tmp_path / "run"):
        _, mark_calls = _calls_in_mpviz(mt.mark, "x")
    trace, read_calls = _calls_in_mpviz(mt.load, tmp_path / "run")
    fig, plot_calls = _calls_in_mpviz(trace.plot)
    assert "x" in {t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))}
    calls = mark_calls + read_calls
    missing = [f"step {n} {path}:{function}: not called" for n, path, function, _ in
               steps[:at_plot] if (path, function) not in calls]
    wrong = missing or _steps_missing_or_out_of_order(steps[at_plot:], plot_calls)
    assert not wrong, ("docs/TOUR.md's 'mark(\"x\") → the picture' is not the way a mark goes:"
                       "\n  " + "\n  ".join(wrong) + "\nFix: name the functions it goes "
                       "through now")


# --- the C accelerators: each beside the Python it mirrors -------------------------------------

def test_every_c_accelerator_names_the_python_it_mirrors_and_the_test_that_compares_them():
    # mpviz/_speedups holds every C file of mpviz, and its TWINS table says, for each, which
    # Python function is the reference and which test runs both: a C file added without its
    # twin, or a twin or test renamed, fails here.
    from mpviz import _speedups
    c_files = sorted(p.relative_to(ROOT / "mpviz").as_posix() for p in (ROOT / "mpviz").rglob("*.c"))
    assert c_files == sorted(f"_speedups/{name}" for name in _speedups.TWINS), (
        f"C files in mpviz: {c_files}; _speedups.TWINS names {sorted(_speedups.TWINS)}. Fix: keep "
        f"every C file in mpviz/_speedups/ with its row in TWINS")
    wrong = []
    for name, pair in _speedups.TWINS.items():
        assert os.path.isfile(_speedups.source(name))
        for where in pair:
            path, function = where.split(":")
            if not (ROOT / path).is_file() or not defined(ROOT / path, function):
                wrong.append(f"{name}: {where} is not there")
    assert not wrong, "\n".join(wrong) + "\nFix: point TWINS at where the twin and test are now"
