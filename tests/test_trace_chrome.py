"""The Chrome/Perfetto export, checked against the Trace Event Format (issue #4)."""
import json
import multiprocessing as mp
import os
import sys
from collections import Counter, defaultdict

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import trace_workers as w  # noqa: E402

import mpviz.trace as mt  # noqa: E402

pytestmark = pytest.mark.timeout(60)

REQUIRED = {                      # keys every event of a phase must have
    "X": {"name", "ph", "ts", "dur", "pid", "tid"},
    "B": {"name", "ph", "ts", "pid", "tid"},
    "E": {"ph", "ts", "pid", "tid"},
    "i": {"name", "ph", "ts", "pid", "tid", "s"},
    "C": {"name", "ph", "ts", "pid", "args"},
    "b": {"name", "ph", "ts", "pid", "cat"},
    "e": {"name", "ph", "ts", "pid", "cat"},
    "n": {"name", "ph", "ts", "pid", "cat"},
    "M": {"name", "ph", "pid", "args"},
}


def validate(data):
    """Return a list of problems with a Chrome trace dict (empty when it is well formed)."""
    problems = []
    events = data.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    slices = defaultdict(list)
    async_open = Counter()
    flows_out, flows_in = Counter(), Counter()
    for k, ev in enumerate(events):
        ph = ev.get("ph")
        if ph not in REQUIRED:
            problems.append(f"event {k}: unknown phase {ph!r}")
            continue
        missing = REQUIRED[ph] - ev.keys()
        if missing:
            problems.append(f"event {k} ({ph}): missing {sorted(missing)}")
        if ph != "M" and not isinstance(ev.get("ts"), (int, float)):
            problems.append(f"event {k}: ts is not a number")
        if ph in "bne" and "id" not in ev and "id2" not in ev:
            problems.append(f"event {k} ({ph}): async event without id/id2")
        if ph == "i" and ev.get("s") not in ("g", "p", "t"):
            problems.append(f"event {k}: instant scope {ev.get('s')!r}")
        if ph == "C" and not all(isinstance(v, (int, float)) for v in ev["args"].values()):
            problems.append(f"event {k}: counter with non-numeric args")
        if ph == "M" and ev["name"] not in ("process_name", "thread_name", "process_sort_index",
                                            "thread_sort_index", "process_labels"):
            problems.append(f"event {k}: unknown metadata {ev['name']!r}")
        if ph == "X":
            if ev["dur"] < 0:
                problems.append(f"event {k}: negative dur")
            slices[(ev["pid"], ev["tid"])].append((ev["ts"], ev["ts"] + ev["dur"], k))
        if ph in "be":
            key = (ev["cat"], json.dumps(ev.get("id", ev.get("id2")), sort_keys=True))
            async_open[key] += 1 if ph == "b" else -1
        if "bind_id" in ev:
            if ph not in ("X", "B", "b", "n"):
                problems.append(f"event {k}: bind_id on phase {ph}")
            if ev.get("flow_out"):
                flows_out[ev["bind_id"]] += 1
            if ev.get("flow_in"):
                flows_in[ev["bind_id"]] += 1
    for thread, spans in slices.items():                  # X slices nest strictly per thread
        stack = []
        for start, end, k in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-6:
                problems.append(f"event {k}: slice overlaps event {stack[-1][2]} on {thread}")
            stack.append((start, end, k))
    for key, n in async_open.items():
        if n != 0:
            problems.append(f"async {key}: {n:+d} unmatched b/e")
    if flows_out != flows_in or any(n != 1 for n in flows_out.values()):
        problems.append(f"flow ids not matched one to one: out={dict(flows_out)} "
                        f"in={dict(flows_in)}")
    return problems


def test_validator_catches_broken_traces():
    bad = {"traceEvents": [
        {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1},       # overlaps a
        {"ph": "X", "name": "c", "ts": 30, "dur": 1, "pid": 1, "tid": 1, "bind_id": "m",
         "flow_out": True},                                                    # no flow_in
        {"ph": "b", "name": "p", "ts": 0, "pid": 1, "cat": "process", "id": "x"},  # no e
        {"ph": "i", "name": "d", "ts": 1, "pid": 1, "tid": 1},                   # no scope
    ]}
    problems = validate(bad)
    assert len(problems) == 5, problems


def test_export_validates(tmp_path):
    ctx = mp.get_context("fork")
    with mt.record() as trace:
        q, results = ctx.Queue(), ctx.Queue()
        lock = ctx.Lock()
        procs = [ctx.Process(target=w.producer, args=(q, 20, "mpviz_chrome_seg")),
                 ctx.Process(target=w.consumer, args=(q, results, "mpviz_chrome_seg"))]
        with lock:
            for p in procs:
                p.start()
        assert results.get() == list(range(20))
        for p in procs:
            p.join()
        with ctx.Pool(2) as pool:
            pool.map(w.square, range(6), chunksize=2)
        mt.recorder.emit("shm.unlink", name="mpviz_chrome_seg", strategy="file_system",
                         nbytes=4096)
        q.put("in flight forever")                        # a put with no get: no flow flags
        q.close()
        q.join_thread()
    data = trace.to_chrome(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == json.loads(json.dumps(data))
    assert validate(data) == []
    events = data["traceEvents"]
    phases = Counter(e["ph"] for e in events)
    assert {"M", "X", "b", "e", "n", "C", "i"} <= set(phases)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("MainProcess" in n for n in names) and len(names) >= 5
    flows = sum(1 for e in events if e.get("flow_out"))
    assert flows == sum(1 for f in trace.flows() if f.get is not None) >= 21
    # microseconds: an event's ts is (ts_ns - t0) / 1000
    t0 = data["otherData"]["t0_ns"]
    last = trace.events[-1]
    assert max(e["ts"] for e in events if "ts" in e) == pytest.approx((last.ts_ns - t0) / 1e3)
    assert [e for e in events if e["ph"] == "C" and e["name"] == "shm bytes live"][-1][
        "args"] == {"bytes": 0}


def _producer_and_consumer(tmp_path, n, tag):
    """The trace of a producer putting `n` messages (and naming a segment) and a consumer
    getting them, forked."""
    ctx = mp.get_context("fork")
    with mt.record(tmp_path / "rec") as trace:
        q, results = ctx.Queue(), ctx.Queue()
        procs = [ctx.Process(target=w.producer, args=(q, n, tag)),
                 ctx.Process(target=w.consumer, args=(q, results, tag))]
        for p in procs:
            p.start()
        assert results.get() == list(range(n))
        for p in procs:
            p.join()
    return trace


def test_trace_json_encoded_in_slices_is_the_text_json_dumps_writes_whole(tmp_path, monkeypatch):
    """The launcher encodes trace.json's events a slice at a time (launcher._json_into, the C
    encoder on each slice): byte for byte the text one json.dumps of the whole dict writes."""
    from mpviz.trace import launcher
    trace = _producer_and_consumer(tmp_path, 60, "mpviz_chrome_aside")
    one = tmp_path / "one.json"
    one.write_bytes(json.dumps(trace.to_chrome()).encode())
    # small slices, so that this small trace is cut as a 290,000-event one is
    monkeypatch.setattr(launcher, "_JSON_SLICE", 7)
    directory = tmp_path / "sliced"
    directory.mkdir()
    path = launcher._write_trace_json(str(directory), trace)
    assert len(trace.to_chrome()["traceEvents"]) > 3 * 7           # (it was cut into slices)
    assert (directory / "trace.json").read_bytes() == one.read_bytes()
    assert path == str(directory / "trace.json")
    assert os.listdir(directory) == ["trace.json"]


def test_trace_json_made_in_two_processes_is_the_same_bytes(tmp_path, monkeypatch):
    """A long trace's trace.json is made in two halves at once (launcher._trace_json_into: a
    forked child makes the instants and messages): byte for byte what json.dumps of
    to_chrome() writes; the child is reaped and its file leaves no trace. A child that fails
    (here: it raises) costs only time -- its half is made again -- and the bytes are the same;
    a fork that fails, the same again."""
    from mpviz.trace import chrome, launcher
    trace = _producer_and_consumer(tmp_path, 60, "mpviz_chrome_halves")
    one = json.dumps(trace.to_chrome()).encode()
    monkeypatch.setattr(launcher, "TWO_HALVES_FROM", 1)          # (this trace is short)
    monkeypatch.setattr(launcher, "_JSON_SLICE", 7)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: trace.json is made in one process")
    forked, again = [], []
    fork = launcher._fork_quietly

    def counted_fork():
        pid = fork()
        if pid:
            forked.append(pid)
        return pid
    monkeypatch.setattr(launcher, "_fork_quietly", counted_fork)
    parent, flow_part = os.getpid(), chrome.flow_part

    def fails_in_the_child(*args):
        if os.getpid() != parent:
            raise RuntimeError("the child's half failed")
        again.append(1)                              # (made again here, after the child)
        return flow_part(*args)
    for name in ("halves", "halves_again"):
        directory = tmp_path / name
        directory.mkdir()
        launcher._write_trace_json(str(directory), trace)
        assert (directory / "trace.json").read_bytes() == one
        assert os.listdir(directory) == ["trace.json"]
        monkeypatch.setattr(chrome, "flow_part", fails_in_the_child)
    assert len(forked) == 2, "trace.json was not made in two processes"
    assert again == [1], "the failed child's half was not made again"
    for pid in forked:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)              # (both children reaped)

    def no_process_to_spare():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(launcher, "_fork_quietly", no_process_to_spare)   # fork fails: all
    monkeypatch.setattr(chrome, "flow_part", flow_part)                   # made here, as one
    directory = tmp_path / "one_process"
    directory.mkdir()
    launcher._write_trace_json(str(directory), trace)
    assert (directory / "trace.json").read_bytes() == one
    assert os.listdir(directory) == ["trace.json"]


# Values that take every branch of _speedups/json_events.c: escapes (short ones, \u00XX, DEL,
# a surrogate pair, a lone surrogate), non-ASCII, ints past 64 bits, float reprs, NaN and
# the infinities, empty and nested containers, tuples, bools (ints to Python, not to JSON), an
# IntEnum (an int subclass: json writes its value).
_AWKWARD = [None, True, False, 0, -1, 2**63 - 1, -2**63, 2**70, -2**70, 1.5, 0.1, 1e16, 1e300,
            1e-300, -0.0, 4944090.849, float("inf"), float("-inf"), float("nan"), "",
            'a"b\\c', "tab\tnl\nret\rbs\bff\f", "\x00\x01\x1f\x7f", "é ü 中 \U0001F600 \ud800",
            [], {}, (), [1, [2, [3, {}]]], {"a": {"b": [], "c": (1.0, None)}},
            __import__("signal").Signals.SIGKILL]


def test_trace_json_is_the_same_bytes_json_dumps_writes(tmp_path):
    """trace.json's events are encoded by _speedups/json_events.c where it builds: for every
    kind of value an event can hold, and for a recorded trace's Chrome events, the bytes are
    json.dumps's; what it cannot encode (a dict key that is not a str, a set) is left to json,
    which converts or refuses as it always does."""
    import io

    from mpviz.trace import launcher
    dumps = launcher._fast_dumps()
    if dumps is None:
        pytest.skip("_speedups/json_events.c cannot be built here (json encodes trace.json)")
    for value in _AWKWARD:
        assert dumps(value) == json.dumps(value).encode(), value
    assert dumps(_AWKWARD) == json.dumps(_AWKWARD).encode()
    for odd in ({1: "int key"}, {None: 1}, {"k": {2.5}}, b"bytes"):
        with pytest.raises(TypeError):
            dumps(odd)
    data = _producer_and_consumer(tmp_path, 30, "mpviz_chrome_json_c").to_chrome()
    assert dumps(data) == json.dumps(data).encode()
    # a slice json_events.c refuses is json's: the file is still json.dumps's text
    data["traceEvents"].append({"ph": "i", "name": "odd", "args": {1: "an int key"}})
    fast, plain = io.BytesIO(), io.BytesIO()
    launcher._json_into(fast, data)
    launcher._json_into(plain, data, fast=False)
    assert fast.getvalue() == plain.getvalue() == json.dumps(data).encode()


def test_a_segment_whose_attach_was_recorded_before_its_create_still_gets_its_slice():
    # Two processes read their clocks at different moments of one exchange: a consumer's attach
    # can be recorded before the producer's create (test_export_validates' workers did so in a
    # fresh-clone run, and trace.json had no slice and no "shm bytes live" at all)
    seg = dict(name="mpviz_fs_order", strategy="file_system", nbytes=4096)
    with mt.record() as trace:
        for kind in ("shm.attach", "shm.create", "shm.detach", "shm.detach", "shm.unlink"):
            mt.recorder.emit(kind, **seg)
    events = trace.to_chrome()["traceEvents"]
    mine = [e["ph"] for e in events if e.get("cat") == "shm" and
            e["id2"]["global"] == "mpviz_fs_order"]
    assert mine == ["n", "b", "n", "n", "e"], mine        # begun at the create, freed at unlink
    live = [e["args"]["bytes"] for e in events if e.get("name") == "shm bytes live"]
    assert live == [4096, 0], live
