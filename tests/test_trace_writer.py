"""The recorder's two Writers, C and pure Python: the same bytes, nothing lost (issue #4).

Every test that takes the ``writer`` fixture runs once per Writer (the C one is skipped, with the
reason, where it cannot be built). ``MPVIZ_PURE_PYTHON=1`` picks the Python Writer; children
inherit it, so a whole run of the suite can be made with either.
"""
import json
import math
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import mpviz.trace as mt
from mpviz import _speedups
from mpviz.trace import native, recorder
from mpviz.trace import reader as reader_module
from mpviz.trace.reader import LogReader

pytestmark = pytest.mark.timeout(90)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ARGS = [
    {},
    {"name": "tick", "i": 5},
    {"s": "", "ascii": "hello", "accents": "héllo wörld", "emoji": "🙂", "surrogate": "\ud800"},
    {"ints": [0, 1, -1, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**62, -2**63, 2**63 - 1]},
    {"i32_max": 2**31 - 1, "i32_min": -2**31, "past_i32": 2**31, "below_i32": -2**31 - 1,
     "big": 2**63 - 1, "small": -2**63, "huge": 2**100, "neg_huge": -2**100},
    {"f": 1.5, "neg_zero": -0.0, "inf": math.inf, "tiny": 5e-324, "max": 1.7976931348623157e308},
    {"t": True, "f": False, "none": None},
    {"nested": {"a": [1, "two", 3.0, None, {"deep": [True, []]}]}, "tuple": (1, 2)},
    {"bytes": b"\x00\xff", "long": "x" * 5000},
]


@pytest.fixture(params=["C", "Python"])
def writer(request, monkeypatch):
    """Which Writer records: chosen by MPVIZ_PURE_PYTHON when recording starts."""
    if request.param == "C" and native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if request.param == "Python" else "0")
    return request.param


@pytest.mark.parametrize("args", ARGS, ids=range(len(ARGS)))
def test_both_writers_encode_the_same_bytes(args):
    c = native.load()
    if c is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    ts, tid = 1_700_000_000_123_456_789, 4_000_000_123
    assert c.encode(ts, tid, "some.kind", args) == recorder.encode(ts, tid, "some.kind", args)


@pytest.mark.parametrize("fill", [0x00, 0xFF, None], ids=["zeros", "ones", "random"])
def test_the_c_checksum_is_zlibs_at_every_length(fill):
    # writer.c adds 16 bytes at a time (SSE2) and the rest one by one, and reduces mod 65521
    # every 5552 bytes: every remainder, both sides of 5552, and bytes that make the sums largest.
    import random
    c = native.load()
    if c is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    rng = random.Random(4)
    for n in list(range(0, 100)) + [5551, 5552, 5553, 5552 * 2 + 17, 70_000]:
        blob = bytes(rng.randrange(256) for _ in range(n)) if fill is None else bytes([fill]) * n
        args = {"b": blob}
        assert c.encode(1, 2, "k", args) == recorder.encode(1, 2, "k", args), n


def test_events_round_trip_exactly(writer, tmp_path):
    with mt.record(tmp_path / "t") as trace:
        assert recorder.writer_name() == writer
        for i, args in enumerate(ARGS):
            recorder.emit(f"kind.{i}", **args)
            recorder.emit_at(12345 + i, "at", i=i)
        mt.mark("a mark", n=3, label="x")
    got = {e.kind: e for e in mt.load(tmp_path / "t")}
    for i, args in enumerate(ARGS):
        assert got[f"kind.{i}"].args == args
    assert sorted(e.ts_ns for e in trace.of_kind("at")) == [12345 + i for i in range(len(ARGS))]
    (m,) = trace.of_kind("mark")
    assert (m.pid, m.tid, m.args) == (os.getpid(), threading.get_native_id(),
                                       {"name": "a mark", "n": 3, "label": "x"})
    assert list(m.args) == ["name", "n", "label"] and trace.problems == []


def test_many_threads_lose_nothing(writer, tmp_path):
    n_threads, n_events = 4, 20_000
    start = threading.Barrier(n_threads)

    def work(k):
        start.wait()
        pad = "x" * (40 * k)                     # different sizes: chunk ends fall anywhere
        for i in range(n_events):
            mt.mark("t", k=k, i=i, pad=pad)

    with mt.record(tmp_path / "t") as trace:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert trace.problems == []
    seen = {}
    for e in trace.of_kind("mark"):
        seen.setdefault(e.args["k"], []).append((e.tid, e.args["i"]))
    assert sorted(seen) == list(range(n_threads))
    for k, events in seen.items():
        assert len({tid for tid, _ in events}) == 1                  # one OS thread each
        assert [i for _, i in events] == list(range(n_events))       # all, in order
    log_sizes = [os.path.getsize(p) for p in (tmp_path / "t").iterdir()]
    assert max(log_sizes) > 3 * recorder.CHUNK                        # several chunks were used


@pytest.mark.parametrize("room", [0, 1, 3, 4, 7, 8, 40])
def test_records_fill_a_chunk_to_its_very_end(writer, tmp_path, room):
    """A chunk left with `room` bytes: the next record goes to the next chunk, none is lost."""
    empty = len(recorder.encode(0, 0, "mark", {"name": "fill", "blob": ""}))
    with mt.record(tmp_path / "t") as trace:
        size = recorder.CHUNK - room - recorder._log.off            # the record that fills it
        mt.mark("fill", blob="x" * (size - empty))
        assert recorder._log.off == recorder.CHUNK - room
        mt.mark("next", i=1)
        assert recorder._log.off > recorder.CHUNK                   # in the second chunk
    assert [e.args["name"] for e in trace.of_kind("mark")] == ["fill", "next"]
    assert trace.problems == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # fork() with threads (3.12+)
def test_fork_while_threads_write(writer, tmp_path):
    stop = threading.Event()

    def chatter():
        i = 0
        while not stop.is_set():
            mt.mark("chatter", i=i)
            i += 1

    children = []
    with mt.record(tmp_path / "t") as trace:
        threads = [threading.Thread(target=chatter) for _ in range(2)]
        for t in threads:
            t.start()
        for k in range(5):
            pid = os.fork()
            if pid == 0:                                          # the child: its own log
                mt.mark("child", k=k)
                os._exit(0)
            children.append(pid)
            os.waitpid(pid, 0)
        stop.set()
        for t in threads:
            t.join()
    assert trace.problems == []
    assert sorted((e.pid, e.args["k"]) for e in trace.of_kind("mark")
                  if e.args["name"] == "child") == sorted(zip(children, range(5)))
    for tid in {e.tid for e in trace.of_kind("mark") if e.pid == os.getpid()}:
        ticks = [e.args["i"] for e in trace.of_kind("mark") if e.tid == tid]
        assert ticks == list(range(len(ticks)))                   # none lost in the parent


def test_a_record_caught_mid_copy_is_read_at_the_next_poll(writer, tmp_path):
    """A live reader that sees a record whose checksum does not match (yet) retries it."""
    assert recorder.start(str(tmp_path), "test")
    mt.mark("first")
    path, off = recorder._log.path, recorder._log.off
    recorder.stop()
    record = recorder.encode(1, 2, "mark", {"name": "second"})
    reader = LogReader(tmp_path)
    assert [e[4]["name"] for e in reader.poll() if e[3] == "mark"] == ["first"]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(record[:-3] + b"\0\0\0")                         # the last bytes not there yet
    assert reader.poll() == [] and reader.problems == []          # not final: no warning
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(record)                                           # ... now they are
    assert [e[4]["name"] for e in reader.poll()] == ["second"]
    assert reader.poll(final=True) == [] and reader.problems == []


def test_side_log_writes_and_reports_bad_args(writer, tmp_path):
    log = recorder.SideLog(str(tmp_path), "watchdog")
    log.emit("watchdog.kill", pids=[1, 2], reason="stuck")
    with pytest.raises(ValueError):
        log.emit("bad", thing=object())                           # raised, not recorded
    log.close()
    kinds = [e.kind for e in mt.load(tmp_path)]
    assert kinds == ["process.start", "watchdog.kill"]


def test_queue_hooks_record_each_message_once_with_either_writer(writer, tmp_path):
    # The C Writer comes with the Queue hooks in C (writer.c's Tap, Hook and Pickler), the Python
    # closures of messages.py: the same events, and every put linked to its get.
    import multiprocessing
    import trace_workers as tw
    from proc_helpers import finish, start
    ctx = multiprocessing.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        q, back = ctx.Queue(), ctx.Queue()
        p = start(ctx, tw.ping, q, back, 3)
        for i in range(3):
            q.put((b"x" * 10 ** (i + 1), i))                         # three sizes, sent back
        answers = [back.get(timeout=10) for _ in range(3)]
        finish(p)
        hook = type(back._recv_bytes).__name__
        put, get = type(q).__dict__["put"], type(q).__dict__["get"]
        bound = q.put
        pickler = multiprocessing.queues._ForkingPickler
    assert answers == [(b"x" * 10 ** (i + 1), i) for i in range(3)]
    assert hook == ("Tap" if writer == "C" else "function")
    # put, get and the feeder's pickler: writer.c's Hook and Pickler with the C Writer
    kinds = {type(put).__name__, type(get).__name__, type(pickler).__name__}
    assert kinds == ({"Hook", "Pickler"} if writer == "C" else {"function", "type"})
    if writer == "C":                                   # the stdlib's, back in place
        assert put.__wrapped__ is multiprocessing.queues.Queue.put
        for name in ("__name__", "__qualname__", "__doc__", "__module__"):  # as it looks
            assert getattr(put, name) == getattr(put.__wrapped__, name)
        assert bound.__self__ is q and bound.__name__ == "put"      # bound, as a method is
    flows = trace.flows()
    assert len(flows) == 6 and all(f.get is not None for f in flows)
    for kind, keys in [("queue.feed", {"queue", "msg", "nbytes", "sig"}),
                       ("queue.get", {"queue", "msg", "nbytes", "sig"})]:
        events = trace.of_kind(kind)
        assert len(events) == 6 and all(set(e.args) == keys for e in events), kind
    feeds = {e.args["msg"]: e for e in trace.of_kind("queue.feed")}
    for f in flows:
        write, read = feeds[f.put.args["msg"]].args, f.get.args
        assert (write["nbytes"], write["sig"]) == (read["nbytes"], read["sig"])
        assert f.put.ts_ns <= feeds[f.put.args["msg"]].ts_ns <= f.get.ts_ns


@pytest.mark.parametrize("first, then", [("Python", "C"), ("C", "Python")])
def test_a_feeder_hooked_under_one_writer_still_links_under_the_other(first, then, tmp_path,
                                                                       monkeypatch):
    # A feeder thread keeps the write hook it started with (a Tap, or messages._fed), while the
    # pickler that tags its messages is the current recording's (writer.c's Pickler, or
    # _TagPickler): each write hook takes the id from either.
    import multiprocessing
    if native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    q = multiprocessing.get_context("fork").Queue()
    try:
        monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if first == "Python" else "0")
        with mt.record(tmp_path / "a"):
            q.put("start")                                  # the feeder starts, hooked
            assert q.get(timeout=10) == "start"
        monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1" if then == "Python" else "0")
        with mt.record(tmp_path / "b") as trace:
            assert recorder.writer_name() == then
            for i in range(3):
                q.put(("x", i))
            assert [q.get(timeout=10) for _ in range(3)] == [("x", i) for i in range(3)]
    finally:
        q.close()
        q.join_thread()
    flows = trace.flows()
    assert len(flows) == 3 and all(f.get is not None for f in flows)
    assert [e.args["msg"] for e in trace.of_kind("queue.feed")] == \
        [f.put.args["msg"] for f in flows]


def test_message_ids_are_unique_across_both_hooks_and_a_fork(writer, tmp_path):
    # writer.c's put numbers messages with messages.py's counter (it keeps a copy, renewed at
    # fork): ids from a stdlib Queue (the C or Python hook) and an mpviz Queue (Python) never
    # repeat, and a forked child's carry its own pid.
    import multiprocessing
    import mpviz.multiprocessing as mp
    import trace_workers as tw
    from proc_helpers import finish, start
    ctx = multiprocessing.get_context("fork")
    with mt.record(tmp_path / "t") as trace:
        a, b = ctx.Queue(), mp.get_context("fork").Queue()
        tw.put_on_both(a, b, 3)
        child = start(ctx, tw.put_on_both, a, b, 3)
        finish(child)
        tw.put_on_both(a, b, 3)
        got = [q.get(timeout=10) for q in (a, b) for _ in range(9)]
    assert sorted(got) == sorted(list(range(3)) * 6)
    puts = trace.of_kind("queue.put")
    ids = [e.args["msg"] for e in puts]
    assert len(puts) == 18 and len(set(ids)) == 18
    assert all(e.args["msg"].startswith(f"{e.pid}.") for e in puts)
    assert {e.pid for e in puts} == {os.getpid(), child.pid}
    assert all(f.get is not None for f in trace.flows())


def test_a_put_that_raises_is_not_left_in_flight(writer, tmp_path):
    # The put is recorded before the stdlib's put runs (a blocked put shows while it waits);
    # when that raises, queue.put_failed closes it: no flow waits for a get that cannot come.
    import multiprocessing
    from queue import Full
    q = multiprocessing.get_context("fork").Queue(maxsize=1)
    try:
        with mt.record(tmp_path / "t") as trace:
            q.put("kept")
            with pytest.raises(Full):
                q.put("refused", False)   # the slot is taken (by position: the C hook's path)
            assert q.get(timeout=10) == "kept"
            q.close()
            with pytest.raises(ValueError):
                q.put("closed")                            # the stdlib's "is closed" error
    finally:
        q.join_thread()
    puts = trace.of_kind("queue.put")
    failed = trace.of_kind("queue.put_failed")
    assert len(puts) == 3
    assert [(e.args["msg"], e.args["error"]) for e in failed] == \
        [(puts[1].args["msg"], "Full"), (puts[2].args["msg"], "ValueError")]
    (flow,) = trace.flows()
    assert flow.put is puts[0] and flow.get is not None
    trace.to_chrome(tmp_path / "t.json")
    chrome = json.load(open(tmp_path / "t.json"))["traceEvents"]
    depths = [e["args"]["depth"] for e in chrome
              if e.get("ph") == "C" and "depth" in e.get("name", "")]
    assert depths[-1] == 0                                 # nothing left in the queue
    shown = [e["args"]["error"] for e in chrome if e.get("name") == "queue.put_failed"]
    assert shown == ["Full", "ValueError"]                 # and the timeline shows why


def test_an_event_that_cannot_be_written_is_dropped_not_the_put(writer, tmp_path):
    # marshal cannot write this queue id: the put's event fails and is dropped with a warning,
    # the message goes through all the same (with either Writer's hooks), recording goes on.
    import multiprocessing
    q = multiprocessing.get_context("fork").Queue()
    q._mpviz_qid = object()
    try:
        with pytest.warns(recorder.RecorderWarning, match="was not recorded"):
            with mt.record(tmp_path / "t") as trace:
                q.put("x")
                assert q.get(timeout=10) == "x"
                mt.mark("after")
        assert "queue.put" in [e.args["kind"] for e in trace.of_kind("record.dropped")]
        assert [e.args["name"] for e in trace.of_kind("mark")] == ["after"]
    finally:
        q.close()
        q.join_thread()


def test_the_c_hooks_leave_unusual_calls_to_the_python_ones(tmp_path):
    # Keywords, too many arguments, the queue by keyword: the Python hook does what the stdlib
    # would (or raises what it would), so the C Hook hands such calls over.
    import multiprocessing
    from multiprocessing.reduction import ForkingPickler
    from mpviz.trace import messages
    c = native.load()
    if c is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    with pytest.raises(ValueError, match="'pit'"):
        c.Hook(kind="pit", call=len, slow=len, messages=messages)
    q = multiprocessing.get_context("fork").Queue()
    try:
        with mt.record(tmp_path / "t") as trace:
            assert type(type(q).__dict__["put"]).__name__ == "Hook"
            with pytest.raises(TypeError):
                q.put("x", True, None, 5)                      # nothing recorded for it
            q.put("a", timeout=5)
            type(q).put(self=q, obj="b")
            assert [q.get(timeout=10), q.get(timeout=10)] == ["a", "b"]
    finally:
        q.close()
        q.join_thread()
    flows = trace.flows()
    assert len(trace.of_kind("queue.put")) == 2 and not trace.of_kind("queue.put_failed")
    assert len(flows) == 2 and all(f.get is not None for f in flows)
    # the feeder's pickler takes protocol= by keyword, as ForkingPickler.dumps does
    pickler = c.Pickler(ForkingPickler, messages._Tag)
    data = pickler.dumps(c.Tag(("obj", 1), "7.1"), protocol=5)
    assert ForkingPickler.loads(data) == ("obj", 1) and c.take_feeding_msg() == "7.1"
    assert c.take_feeding_msg() is None                         # taken: gone


def test_pure_python_is_forced_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MPVIZ_PURE_PYTHON", "1")
    with mt.record(tmp_path / "t"):
        assert recorder.writer_name() == "Python"


def _native_in_child(tmp_path, **env):
    """Run native.load() in a fresh interpreter with `env`; (its report, its stderr)."""
    code = textwrap.dedent("""
        import warnings, mpviz.trace as mt
        from mpviz.trace import native, recorder
        warnings.simplefilter("error")
        module = native.load()
        with mt.record() as trace:
            mt.mark("m")
            name = recorder.writer_name()
        print(module is not None, name, len(trace.of_kind("mark")))
        print(native.problem)
    """)
    full = {**os.environ, "MPVIZ_CACHE_DIR": str(tmp_path / "cache"), **env}
    full.pop("MPVIZ_PURE_PYTHON", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines(), r.stderr


def test_no_compiler_means_the_python_writer_quietly(tmp_path):
    out, err = _native_in_child(tmp_path, PATH="/nonexistent", CC="")
    assert out[0] == "False Python 1" and "no C compiler" in out[1] and err == ""


def test_a_failed_build_is_not_tried_again(tmp_path):
    out, err = _native_in_child(tmp_path, CC="false")            # a "compiler" that fails
    assert out[0] == "False Python 1" and "compiling writer.c failed" in out[1] and err == ""
    (failed,) = (tmp_path / "cache").glob("*.failed")
    out, err = _native_in_child(tmp_path, CC="false")
    assert "an earlier build failed" in out[1] and str(failed) in out[1]


# -- writer.c's Tap moves a plain pipe's bytes itself: the same bytes, the same errors ----------

def _c_tap():
    c = native.load()
    if c is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    return c.Tap


def _never(*args):
    """A Tap's `call` that must not be called: given a connection, the Tap moves bytes itself."""
    raise AssertionError("the Tap called back into Python instead of using its pipe")


@pytest.mark.parametrize("size", [0, 1, 16384, 16385, 70_000, 300_000])
def test_the_tap_reads_and_writes_a_pipe_as_a_connection_does(size, tmp_path):
    # Sizes around the one-write limit (16 KiB) and past a pipe's capacity (64 KiB): a write
    # and a read in pieces. Each side is checked against the stdlib's other side.
    import multiprocessing
    Tap = _c_tap()
    reader, writer = multiprocessing.Pipe(duplex=False)
    feeding = threading.local()
    data = os.urandom(size)
    with mt.record(tmp_path / "t") as trace:
        send = Tap(_never, "queue.feed", "q", feeding, None, writer)
        recv = Tap(_never, "queue.get", "q", None, b"mark", reader)
        got = []
        t = threading.Thread(target=lambda: got.append(reader.recv_bytes()))
        t.start()
        assert send(data) is None                   # ours writes ...
        t.join(30)
        assert got == [data]                        # ... what the stdlib reads
        t = threading.Thread(target=writer.send_bytes, args=(data,))
        t.start()
        assert recv() == data                       # and reads what the stdlib writes
        t.join(30)
    reader.close()
    writer.close()
    sizes = [(e.kind, e.args["nbytes"]) for e in trace.events if e.kind.startswith("queue.")]
    assert sizes == [("queue.feed", size), ("queue.get", size)]


def test_the_tap_raises_what_a_connection_raises(tmp_path):
    import multiprocessing
    import struct
    Tap = _c_tap()
    reader, writer = multiprocessing.Pipe(duplex=False)
    recv = Tap(_never, "queue.get", "q", None, b"mark", reader)
    os.write(writer.fileno(), struct.pack("!i", 10) + b"abc")   # a message cut short ...
    writer.close()
    with pytest.raises(OSError, match="got end of file during message"):
        recv()
    with pytest.raises(EOFError):                   # ... then nothing at all
        recv()
    reader.close()
    recv = Tap(reader.recv_bytes, "queue.get", "q", None, b"mark", reader)
    with pytest.raises(OSError, match="handle is closed"):   # closed: the stdlib's own check,
        recv()                                               # through `call`
    reader, writer = multiprocessing.Pipe(duplex=False)
    send = Tap(_never, "queue.feed", "q", threading.local(), None, writer)
    reader.close()
    with pytest.raises(BrokenPipeError):            # nobody reads any more
        send(b"x")
    writer.close()


def test_the_tap_leaves_a_read_it_does_not_know_to_its_owner():
    # A _recv_bytes that is not exactly the Connection's (someone else's wrapper) is called as
    # it is: _plain_pipe gives the Tap no connection to read itself.
    import multiprocessing
    from mpviz.trace import messages
    Tap = _c_tap()
    reader, writer = multiprocessing.Pipe(duplex=False)
    assert messages._plain_pipe(reader.recv_bytes, reader) is reader
    assert messages._plain_pipe(writer.send_bytes, writer) is writer
    assert messages._plain_pipe(reader.recv_bytes, writer) is None
    calls = []

    def wrapper():
        calls.append("wrapper")
        return reader.recv_bytes()
    assert messages._plain_pipe(wrapper, reader) is None
    recv = Tap(wrapper, "queue.get", "q", None, b"mark", messages._plain_pipe(wrapper, reader))
    writer.send_bytes(b"hello")
    assert recv() == b"hello" and calls == ["wrapper"]
    reader.close()
    writer.close()
    import mpviz.multiprocessing as mp                # mpviz's Queue reads with _pipe.read_message
    q = mp.get_context("fork").Queue()
    assert messages._plain_pipe(q._recv_bytes, q._reader) is q._reader
    assert messages._plain_pipe(q._recv_bytes, q._writer) is None    # another fd
    q.close()


def test_a_ctrl_c_while_a_chunk_is_mapped_stops_the_program_not_just_its_recording(writer):
    # on_full (mapping the next chunk) is interrupted: both Writers let the KeyboardInterrupt
    # through, while an ordinary failure goes to on_error and the program goes on.
    import mmap
    cls = recorder.writer_class()
    told = []

    def on_full(exc):
        def full():
            raise exc
        return full
    for exc, raised in [(KeyboardInterrupt(), True), (OSError("disk full"), False)]:
        w = cls(on_full(exc), lambda kind, e: told.append((kind, type(e).__name__)), 1 << 10)
        w.use(mmap.mmap(-1, 64), 0)                 # room for one small event, not two
        w.emit("first", {})
        if raised:
            with pytest.raises(KeyboardInterrupt):
                w.emit("second", {"pad": "x" * 40})
        else:
            w.emit("second", {"pad": "x" * 40})
        w.use(None, 0)
    assert told == [("second", "OSError")]


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="checked in CI only: a developer's "
                    "machine may lack Python's headers, and then the Python Writer records")
def test_in_ci_the_c_writer_builds_where_there_is_a_compiler():
    # Where writer.c cannot be built, the C half of the recorder tests skips, and a CI run would
    # pass without it. With a compiler here, a failed build is a bug to see, not a skip.
    if _speedups._compiler() is None:
        pytest.skip("no C compiler on this machine: the Python Writer records")
    assert native.load() is not None, f"writer.c did not build: {native.problem}"


def test_both_readers_read_the_same_events_past_the_same_damage(tmp_path, monkeypatch):
    # reader.py hands whole runs of good records to writer.c's read_records and keeps every
    # other case (a bad checksum, a wild length, the end) for its own loop: the events, the
    # waits it ends, and the problems it reports must be the same either way.
    if native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    assert recorder.start(str(tmp_path), "test")
    starts = []
    for i in range(3000):
        starts.append(recorder._log.off)
        recorder.emit("wait.begin", on="queue.get", id="q1")
        recorder.emit("queue.get", queue="q1", msg=None, nbytes=i, sig=7)
        recorder.emit(f"kind.{i % len(ARGS)}", **ARGS[i % len(ARGS)])
        recorder.emit("wait.end", on="queue.get", id="q1", ok=True)
    path = recorder._log.path
    recorder.stop()
    with open(path, "r+b") as f:
        f.seek(starts[700] + 20)                           # a flipped byte: bad checksum
        f.write(b"\xa5")
        f.seek(starts[2100])
        f.write((0x7FFFFFF0).to_bytes(4, "little"))        # a length running off the chunk
    read = {}
    for pure in ("0", "1"):
        monkeypatch.setenv("MPVIZ_PURE_PYTHON", pure)
        reader = LogReader(tmp_path)
        with pytest.warns(Warning, match="skipped"):
            read[pure] = (reader.poll(final=True), reader.problems, reader.skipped_bytes)
        assert (reader_module._native_reader() is None) == (pure == "1")   # which one read
    assert read["0"] == read["1"]
    events, problems, _ = read["0"]
    assert len(problems) == 2 and all("skipped" in p for p in problems)
    # the two damaged records were wait.begins: those two gets' waits end at their own
    # wait.end; every other get's wait ends at its queue.get (the reader's), its wait.end dropped
    assert len(events) == 1 + 4 * 3000 - 2                   # (1: process.start)
    assert sum(e[3] == "wait.begin" for e in events) == 2998
    assert sum(e[3] == "wait.end" for e in events) == 3000
    assert sum(e[3].startswith("kind.") for e in events) == 3000


def _ping(inbox, outbox, n):
    for _ in range(n):
        outbox.put(inbox.get())


def _square(x):
    return x * x


def test_both_readers_read_the_same_events_from_a_real_programs_logs(tmp_path, monkeypatch):
    # not made-up records: the logs of real processes (a Queue ping-pong, whose gets wait, and a
    # Pool), read once by writer.c's read_records and once by reader.py's own loop
    if native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    import multiprocessing as mp
    fork = mp.get_context("fork")
    with mt.record(tmp_path / "t"):
        a, b = fork.Queue(), fork.Queue()
        p = fork.Process(target=_ping, args=(a, b, 50))
        p.start()
        for i in range(50):
            a.put(i)
            assert b.get() == i
        p.join()
        pool = fork.Pool(2)
        assert pool.map(_square, range(20)) == [i * i for i in range(20)]
        pool.close()       # (not terminate(), as `with` does: a worker still starting when
        pool.join()        # it is terminated records nothing, and the run had 3 logs, not 4)
    read = {}
    for pure in ("0", "1"):
        monkeypatch.setenv("MPVIZ_PURE_PYTHON", pure)
        reader = LogReader(tmp_path / "t")
        read[pure] = (reader.poll(final=True), reader.problems)
    assert read["0"] == read["1"]
    events = read["0"][0]
    assert len({e[1] for e in events}) >= 4 and not read["0"][1]
    assert sum(e[3] == "wait.end" and e[4].get("on") == "queue.get" for e in events) > 0


def test_the_wait_kinds_the_reader_follows_are_decided_in_one_place(tmp_path, monkeypatch):
    # reader._WAIT_KINDS says which kinds _Waits sees (and so which get's wait.end is written
    # back in): emptied, both readers must hand back the records as written -- the C reader
    # once kept its own list and went on pairing (tests/test_get_wait_cost.py's raw read)
    if native.load() is None:
        pytest.skip(f"no C Writer here: {native.problem}")
    assert recorder.start(str(tmp_path), "test")
    for i in range(100):
        recorder.emit("wait.begin", on="queue.get", id="q1")
        recorder.emit("queue.get", queue="q1", msg=None, nbytes=i, sig=7)
    recorder.stop()
    monkeypatch.setattr(reader_module, "_WAIT_KINDS", frozenset())
    for pure in ("0", "1"):
        monkeypatch.setenv("MPVIZ_PURE_PYTHON", pure)
        events = LogReader(tmp_path).poll(final=True)
        assert not [e for e in events if e[3] == "wait.end"], f"MPVIZ_PURE_PYTHON={pure}"
        assert len(events) == 1 + 200
