"""Bad input gets a clear error at the call (what, why, Fix) — and good input is not refused.

Four groups: the main-guard and __main__-function checks agree with when spawn re-runs the main
module; misuse of Process, Pool and spawn is refused at the call instead of failing in a child
or on a bare assert; the MPVIZ_* environment is checked at import; and the recorder and reader
lose one event (or one damaged record), never the rest.
"""
import os
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile

import pytest

import mpviz.multiprocessing as mp
import mpviz.trace as mt
from mpviz.multiprocessing import MissingMainGuardError, UnpicklableFunctionError
from mpviz.trace import native, recorder
from mpviz.trace.reader import LogReader, TraceFormatWarning

import workers

pytestmark = pytest.mark.timeout(90)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS, os.environ.get("PYTHONPATH", "")]))


def run(args, cwd, env=ENV, **kw):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env, **kw)


# --- the main-guard check: refuse exactly what spawn would run again ---------------------

# Module-level code with no main guard, starting a spawn child of an importable function.
UNGUARDED_START = """
import mpviz.multiprocessing as mp
import workers
p = mp.get_context("{method}").Process(target=workers.rank_noop, args=(0,))
p.start()
p.join()
print("exitcode", p.exitcode)
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_python_m_package_runs_unguarded(tmp_path, method):
    # A package's __main__.py is never run again by a child (spawn's _fixup_main_from_name).
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(UNGUARDED_START.format(method=method))
    out = run(["-m", "pkg"], cwd=tmp_path)
    assert out.returncode == 0 and "exitcode 0" in out.stdout, out.stderr


@pytest.mark.parametrize("as_zip", [False, True], ids=["directory", "zip"])
def test_a_directory_or_zip_run_as_a_script_runs_unguarded(tmp_path, as_zip):
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(UNGUARDED_START.format(method="spawn"))
    target = app
    if as_zip:
        target = tmp_path / "app.zip"
        with zipfile.ZipFile(target, "w") as z:
            z.write(app / "__main__.py", "__main__.py")
    out = run([str(target)], cwd=tmp_path)
    assert out.returncode == 0 and "exitcode 0" in out.stdout, out.stderr


def test_python_m_unittest_runs_a_test_that_spawns(tmp_path):
    # The stdlib's own multiprocessing tests are run this way: unittest's __main__.py starts them.
    (tmp_path / "test_tiny.py").write_text(textwrap.dedent("""
        import unittest
        import mpviz.multiprocessing as mp

        def child(q):
            q.put("hello from the child")

        class T(unittest.TestCase):
            def test_spawn(self):
                ctx = mp.get_context("spawn")
                q = ctx.Queue()
                p = ctx.Process(target=child, args=(q,))
                p.start()
                self.assertEqual(q.get(timeout=30), "hello from the child")
                p.join()
                self.assertEqual(p.exitcode, 0)
    """))
    out = run(["-m", "unittest", "-v", "test_tiny"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Ran 1 test" in out.stderr and "OK" in out.stderr


@pytest.mark.parametrize("how", ["script", "python -m", "script without .py"])
def test_unguarded_code_that_spawn_runs_again_is_still_refused(tmp_path, how):
    # spawn runs these again in each child (a script is run by path whatever its name).
    name = "unguarded" if how == "script without .py" else "unguarded.py"
    (tmp_path / name).write_text(UNGUARDED_START.format(method="spawn"))
    out = run(["-m", "unguarded"] if how == "python -m" else [name], cwd=tmp_path)
    assert out.returncode == 1
    assert f"MissingMainGuardError: {name}, line 5, starts a process" in out.stderr
    assert "if __name__ == '__main__':" in out.stderr
    # the stdlib's words kept (CPython's fork-bomb test looks for RuntimeError in the output)
    assert "raises RuntimeError there" in out.stderr and "bootstrapping phase" in out.stderr


# --- a __main__ function the child will not have: refused by Process too -----------------

GUARDED_DEF = """
import mpviz.multiprocessing as mp
if __name__ == "__main__":
    def work():
        print("the child ran")
    p = mp.get_context("{method}").Process(target=work)
    try:
        p.start()
    except mp.UnpicklableFunctionError as e:
        print("REFUSED:", e)
    else:
        p.join()
        print("exitcode", p.exitcode)
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process_refuses_a_function_defined_under_the_main_guard(tmp_path, method):
    (tmp_path / "guarded.py").write_text(GUARDED_DEF.format(method=method))
    out = run(["guarded.py"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "REFUSED: the target work() is defined in __main__ under its `if __name__ == " \
           "'__main__':` guard (guarded.py, line 4)" in out.stdout
    assert "Fix: define work() at module level" in out.stdout
    assert "Can't get attribute" not in out.stderr          # no child died for it


def test_process_refuses_a_function_of_python_c(tmp_path):
    code = GUARDED_DEF.format(method="spawn").replace('if __name__ == "__main__":', "if True:")
    out = run(["-c", code], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "REFUSED: the target work() is defined in __main__ of `python -c` code" in out.stdout


def test_process_refuses_a_function_of_a_packages_main(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        GUARDED_DEF.format(method="spawn").replace('if __name__ == "__main__":', "if True:"))
    out = run(["-m", "pkg"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "REFUSED: the target work() is defined in __main__ run as 'pkg.__main__'" in out.stdout
    assert "never runs again" in out.stdout


def test_a_module_level_function_of_the_script_still_runs(tmp_path):
    (tmp_path / "fine.py").write_text(textwrap.dedent("""
        import mpviz.multiprocessing as mp
        def work():
            pass
        if __name__ == "__main__":
            p = mp.get_context("spawn").Process(target=work)
            p.start(); p.join()
            print("exitcode", p.exitcode)
    """))
    out = run(["fine.py"], cwd=tmp_path)
    assert out.returncode == 0 and "exitcode 0" in out.stdout, out.stderr


# --- spawn / start_processes -------------------------------------------------------------

@pytest.mark.parametrize("call", [mp.start_processes, mp.spawn])
def test_an_unknown_start_method_is_named(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)     # spawn's "only spawn" warning
        with pytest.raises(ValueError, match=r"start_method='bogus' is not a start method here; "
                                             r"this platform has \[.*'spawn'.*\]\. Fix:"):
            call(workers.rank_noop, nprocs=1, start_method="bogus")


@pytest.mark.parametrize("nprocs, error, text", [
    (True, TypeError, "nprocs must be an int .*not bool True"),
    (2.0, TypeError, "nprocs must be an int .*not float 2.0"),
    (0, ValueError, "nprocs must be at least 1, not 0"),
])
def test_spawn_refuses_a_bad_nprocs_at_the_call(nprocs, error, text):
    with pytest.raises(error, match=text):
        mp.start_processes(workers.rank_noop, nprocs=nprocs)


@pytest.mark.parametrize("args, text", [
    (5, r"args must be a tuple .*not int 5\. Fix: args=\(5,\)"),
    ("ab", r"args is the str 'ab', not a tuple: .* into 2 separate arguments"),
    ({"x": 1}, r"args must be a tuple .*not dict"),
])
def test_spawn_refuses_bad_args_at_the_call(args, text):
    with pytest.raises(TypeError, match=text):
        mp.start_processes(workers.rank_noop, args=args, nprocs=1)


# --- Process -----------------------------------------------------------------------------

def test_starting_a_process_twice_says_so():
    p = mp.get_context("fork").Process(target=workers.rank_noop, args=(0,))
    p.start()
    p.join()
    with pytest.raises(RuntimeError, match=r"was already started \(pid \d+\): a Process object "
                                           r"runs its target once.*Fix: create a new Process"):
        p.start()


@pytest.mark.parametrize("kwargs, error, text", [
    ({"target": 5}, TypeError, "target must be a function to run in the child, not int 5"),
    ({"target": workers.rank_noop, "args": 5}, TypeError, r"Fix: args=\(5,\)"),
    ({"target": workers.rank_noop, "args": "ab"}, TypeError, "one per character"),
    ({"target": workers.rank_noop, "kwargs": [1]}, TypeError, "kwargs must be a dict"),
    ({"target": workers.rank_noop, "name": 5}, TypeError, "name must be a str"),
    ({"group": "g"}, ValueError, "group must be None"),
])
def test_process_refuses_bad_arguments_at_construction(kwargs, error, text):
    with pytest.raises(error, match=text):
        mp.Process(**kwargs)


def test_process_takes_any_iterable_of_args_as_the_stdlib_does():
    # Not refused: the stdlib runs tuple(args); only a str, bytes or dict is taken as a mistake.
    p = mp.get_context("fork").Process(target=workers.rank_noop, args=(i for i in [0]))
    p.start()
    p.join()
    assert p.exitcode == 0


def test_join_before_start_says_so():
    p = mp.Process(target=workers.rank_noop, args=(0,))
    with pytest.raises(RuntimeError, match=r"never started.*Fix: call start\(\) before join"):
        p.join()


def test_join_with_a_timeout_that_is_not_a_number():
    p = mp.get_context("fork").Process(target=workers.rank_noop, args=(0,))
    p.start()
    try:
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None, not str"):
            p.join(timeout="5")
    finally:
        p.join()


def test_a_closed_process_cannot_start():
    p = mp.Process(target=workers.rank_noop, args=(0,))
    p.close()
    with pytest.raises(ValueError, match=r"was closed \(Process.close\(\)\), so it cannot start"):
        p.start()


def _start_and_report(process, conn):
    try:
        process.start()
        process.join()
        conn.send("started")
    except RuntimeError as e:
        conn.send(str(e))


def _start_child_and_report(conn):
    _start_and_report(mp.get_context("fork").Process(target=workers.rank_noop, args=(0,)), conn)


def _hear_from(target, args, daemon=False):
    ctx = mp.get_context("fork")
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=target, args=(*args, theirs), daemon=daemon)
    p.start()
    try:
        assert mine.poll(30)
        return mine.recv()
    finally:
        p.join()
        mine.close()
        theirs.close()


def test_a_daemonic_process_cannot_start_children():
    said = _hear_from(_start_child_and_report, (), daemon=True)
    assert "is a daemonic process (a Pool worker, or a Process(daemon=True)), and daemonic " \
           "processes may not start children" in said


def test_only_the_creator_may_start_a_process():
    other = mp.get_context("fork").Process(target=workers.rank_noop, args=(0,))
    said = _hear_from(_start_and_report, (other,))
    assert f"was created by process {os.getpid()}, not by this one" in said


# --- Pool --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, text", [
    ({"processes": "2"}, TypeError, r"processes must be an int .*not str '2'\. Fix: Pool\(2\)"),
    ({"processes": True}, TypeError, "processes must be an int .*not bool True"),
    ({"processes": 0}, ValueError, "processes must be at least 1, not 0"),
    ({"processes": 1, "initializer": 5}, TypeError, "initializer must be a function"),
    ({"processes": 1, "initializer": workers.rank_noop, "initargs": 5}, TypeError,
     r"initargs must be a tuple .*Fix: initargs=\(5,\)"),
])
def test_pool_refuses_bad_arguments_before_starting_workers(kwargs, error, text):
    with pytest.raises(error, match=text):
        mp.get_context("spawn").Pool(**kwargs)


def test_pool_apply_async_refuses_bad_args():
    with mp.get_context("fork").Pool(1) as pool:
        with pytest.raises(TypeError, match=r"args must be a tuple .*Fix: args=\(5,\)"):
            pool.apply_async(workers.add_one, args=5)
        assert pool.apply(workers.add_one, (1,)) == 2        # the pool is still fine


def test_get_context_of_an_unknown_method():
    with pytest.raises(ValueError, match=r"cannot find context for 'bogus': it is not a start "
                                         r"method this platform has.*Fix: get_context\('spawn'\)"):
        mp.get_context("bogus")


# --- the MPVIZ_* environment, checked when mpviz is imported -----------------------------

@pytest.mark.parametrize("name, value, text", [
    ("MPVIZ_SHARING_STRATEGY", "bogus",
     "MPVIZ_SHARING_STRATEGY='bogus' is not a sharing strategy here"),
    ("MPVIZ_SHM_CACHE_BYTES", "-5", "MPVIZ_SHM_CACHE_BYTES='-5' is negative"),
    ("MPVIZ_SHM_CACHE_BYTES", "256M", "MPVIZ_SHM_CACHE_BYTES='256M' is not a number of bytes"),
    ("MPVIZ_SHM_TAG", "t" * 300, "MPVIZ_SHM_TAG is 300 bytes long"),
    ("MPVIZ_SHM_TAG", "é" * 101, "MPVIZ_SHM_TAG is 202 bytes long"),   # bytes, not characters
    ("MPVIZ_SHM_TAG", "my run", "MPVIZ_SHM_TAG='my run'"),
])
def test_a_bad_environment_setting_fails_at_import(tmp_path, name, value, text):
    out = run(["-c", "import mpviz"], cwd=tmp_path, env=dict(ENV, **{name: value}))
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: ") and text in last
    assert "Fix" in last or "use e.g." in last


def test_an_empty_strategy_variable_means_the_default(tmp_path):
    out = run(["-c", "import mpviz.multiprocessing as mp; print(mp.get_sharing_strategy())"],
              cwd=tmp_path, env=dict(ENV, MPVIZ_SHARING_STRATEGY=""))
    assert out.returncode == 0 and out.stdout.strip() == "file_descriptor", out.stderr


# --- the recorder: one bad event costs that event only -----------------------------------

@pytest.fixture(params=["Python", "C"])
def writer(request, monkeypatch):
    if request.param == "C" and native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if request.param == "Python" else "0")
    return request.param


@pytest.mark.parametrize("bad, text", [
    ({"obj": object()}, "unmarshallable object"),
    ({"blob": "x" * (2 << 20)}, "larger than a log chunk"),
    ({"nested": {1: [set([frozenset()]), object()]}}, "unmarshallable object"),
])
def test_one_bad_mark_is_dropped_and_recording_goes_on(writer, tmp_path, bad, text):
    with pytest.warns(recorder.RecorderWarning, match=r"a 'mark' event was not recorded "
                                                      r"\(.*\); recording goes on\. Fix:"):
        with mt.record(tmp_path / "t") as trace:
            assert recorder.writer_name() == writer
            mt.mark("before")
            mt.mark("bad", **bad)
            for i in range(100):
                mt.mark("after", i=i)
    assert [e.args["name"] for e in trace.of_kind("mark")] == ["before"] + ["after"] * 100
    (dropped,) = trace.of_kind("record.dropped")
    assert dropped.args["kind"] == "mark" and text in dropped.args["error"]
    assert trace.problems == []


def test_an_event_kind_too_long_is_dropped_not_the_recording(writer, tmp_path):
    with pytest.warns(recorder.RecorderWarning, match="longer than 255 bytes"):
        with mt.record(tmp_path / "t") as trace:
            recorder.emit("k" * 300, x=1)
            mt.mark("after")
    assert [e.args["name"] for e in trace.of_kind("mark")] == ["after"]
    assert trace.of_kind("record.dropped")[0].args["kind"] == "k" * 126 + "..." + "k" * 126


# --- the reader: one damaged record costs that record only -------------------------------

def _log_of_marks(directory, n):
    """A real log of `n` marks; returns its path and where each mark's record starts."""
    assert recorder.start(str(directory), "test")
    starts = []
    for i in range(n):
        starts.append(recorder._log.off)
        mt.mark("m", i=i)
    path = recorder._log.path
    recorder.stop()
    return path, starts


@pytest.mark.parametrize("where", ["body", "checksum", "length", "length to 0"])
def test_a_damaged_record_costs_only_itself(tmp_path, where):
    path, starts = _log_of_marks(tmp_path, 200)
    victim = 19
    with open(path, "r+b") as f:
        at = starts[victim] + {"body": 30, "checksum": 5, "length": 1, "length to 0": 0}[where]
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        if where == "length to 0":
            f.write(struct.pack("<I", 0))
        else:
            f.write(bytes([old ^ 0x5A]))
    reader = LogReader(tmp_path)
    with pytest.warns(TraceFormatWarning, match=r"at offset %d \(a damaged record\); skipped "
                                                r"(\d+) bytes to the next record whose checksum "
                                                r"holds, at offset %d" % (starts[victim],
                                                                         starts[victim + 1])):
        events = reader.poll(final=True)
    marks = [e[4]["i"] for e in events if e[3] == "mark"]
    assert marks == [i for i in range(200) if i != victim]
    assert reader.skipped_bytes == starts[victim + 1] - starts[victim]


def test_a_live_read_waits_at_a_zero_length_and_resyncs_at_the_final_read(tmp_path):
    # While a writer may be running, a length of 0 is "not written yet": no scan, no warning.
    path, starts = _log_of_marks(tmp_path, 50)
    with open(path, "r+b") as f:
        f.seek(starts[10])
        f.write(bytes(4))
    reader = LogReader(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        live = reader.poll()
    assert [e[4]["i"] for e in live if e[3] == "mark"] == list(range(10))
    with pytest.warns(TraceFormatWarning, match="a record length of 0"):
        rest = reader.poll(final=True)
    assert [e[4]["i"] for e in rest] == list(range(11, 50))


def test_damage_with_nothing_good_after_it_skips_the_rest_and_says_so(tmp_path):
    path, starts = _log_of_marks(tmp_path, 20)
    with open(path, "r+b") as f:
        f.seek(starts[-1] + 30)
        f.write(b"\xff")
    with pytest.warns(TraceFormatWarning, match="the rest of this log is skipped"):
        trace = mt.load(tmp_path)
    assert [e.args["i"] for e in trace.of_kind("mark")] == list(range(19))
