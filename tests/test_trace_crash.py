"""Crash safety and bad input: killed writers, torn records, unusable directories (issue #4)."""
import multiprocessing as mp
import os
import struct
import sys
import warnings

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import trace_workers as w  # noqa: E402

import mpviz.trace as mt  # noqa: E402
from mpviz.trace import recorder  # noqa: E402
from mpviz.trace.reader import TraceFormatWarning  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_sigkilled_child_loses_none_of_its_events(method, tmp_path):
    ctx = mp.get_context(method)
    with mt.record(tmp_path / "t") as trace:
        p = ctx.Process(target=w.marks_then_sigkill, args=(5000,))
        p.start()
        p.join()
    assert p.exitcode == -9
    for t in (trace, mt.load(tmp_path / "t")):            # in the block's trace and reloaded
        ticks = [e.args["i"] for e in t.of_kind("mark") if e.pid == p.pid]
        assert ticks == list(range(5000))
        (info,) = [x for x in t.processes() if x.pid == p.pid]
        assert (info.exitcode, info.signal) == (-9, "SIGKILL")
        assert t.problems == []


def _write_log(directory, n):
    """A real log of `n` marks, written by this process, then closed."""
    assert recorder.start(str(directory), "test")
    for i in range(n):
        last = recorder._log.off                           # where the last record starts
        mt.mark("m", i=i)
    path = recorder._log.path
    end = recorder._log.off
    recorder.stop()
    return path, end, last


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mt.load(tmp_path / "nope")


def test_empty_directory_warns(tmp_path):
    with pytest.warns(TraceFormatWarning, match="holds no"):
        trace = mt.load(tmp_path)
    assert trace.events == []


def test_newer_format_is_skipped_with_a_warning(tmp_path):
    path, _, _ = _write_log(tmp_path, 3)
    newer, _, _ = _write_log(tmp_path, 4)
    with open(newer, "r+b") as f:                          # bump the version field
        f.seek(8)
        f.write(struct.pack("<H", 99))
    with pytest.warns(TraceFormatWarning, match="format 99"):
        trace = mt.load(tmp_path)
    assert len(trace.of_kind("mark")) == 3 and len(trace.problems) == 1


@pytest.mark.parametrize("damage", ["truncated file", "torn payload", "wild length"])
def test_torn_last_record_is_skipped(tmp_path, damage):
    path, end, last = _write_log(tmp_path, 10)
    with open(path, "r+b") as f:
        if damage == "truncated file":
            f.truncate(end - 3)                            # cut inside the last record
        elif damage == "torn payload":
            f.seek(end - 6)
            f.write(b"\xff" * 6)                           # garbage where the payload ended
        else:
            f.seek(last)
            f.write(struct.pack("<I", 0x7FFFFFF0))         # a length running off the chunk
    with pytest.warns(TraceFormatWarning, match="skipped"):
        trace = mt.load(tmp_path)
    marks = [e.args["i"] for e in trace.of_kind("mark")]
    assert marks == list(range(9))


def test_not_a_log_file_is_skipped(tmp_path):
    _write_log(tmp_path, 2)
    (tmp_path / "junk.mpvlog").write_bytes(b"hello, I am not a log" * 10)
    (tmp_path / "short.mpvlog").write_bytes(b"MPV")
    with pytest.warns(TraceFormatWarning):
        trace = mt.load(tmp_path)
    assert len(trace.of_kind("mark")) == 2 and len(trace.problems) == 2


def test_recording_that_cannot_start_lets_the_program_run(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    ran = False
    with pytest.warns(recorder.RecorderWarning, match="cannot record"):
        with mt.record(blocker / "trace") as trace:
            mt.mark("unrecorded")
            ran = True
    assert ran and trace.events == [] and recorder.ENABLED is False


def test_one_bad_event_is_dropped_said_and_recording_goes_on(tmp_path):
    # An event that cannot be encoded costs that event only: a warning, a record.dropped in its
    # place, and every later event is recorded (with either Writer, see test_trace_writer).
    with pytest.warns(recorder.RecorderWarning) as said:
        with mt.record(tmp_path / "t") as trace:
            mt.mark("before")
            mt.mark("too big", blob="x" * (2 * recorder.CHUNK))  # cannot fit in a log chunk
            mt.mark("unmarshallable", obj=object())              # marshal cannot write it
            assert recorder.ENABLED is True
            mt.mark("after")
    assert [e.args["name"] for e in trace.of_kind("mark")] == ["before", "after"]
    dropped = trace.of_kind("record.dropped")
    assert [e.args["kind"] for e in dropped] == ["mark", "mark"]
    assert "larger than a log chunk" in dropped[0].args["error"]
    assert "unmarshallable" in dropped[1].args["error"]
    texts = [str(w.message) for w in said]
    assert len(texts) == 2 and all("was not recorded" in t and "recording goes on" in t
                                   for t in texts)


def test_a_failing_log_disables_recording_and_says_so(tmp_path):
    # The log itself failing (here: its next chunk cannot be reserved, the file is gone from
    # under a closed descriptor) is different: nothing more can be written, recording stops.
    with pytest.warns(recorder.RecorderWarning, match="recording stopped in pid"):
        with mt.record(tmp_path / "t") as trace:
            mt.mark("before")
            log = recorder._log
            os.close(log.fd)
            null = log.fd = os.open(os.devnull, os.O_RDONLY)   # fallocate on it: an OSError
            for i in range(recorder.CHUNK // 1000 + 2):         # fill the first chunk
                mt.mark("filler", i=i, pad="x" * 1000)
            assert recorder.ENABLED is False
            mt.mark("after")                                     # a no-op now, no error
    os.close(null)               # (not the log: the recorder leaves it open, as it must)
    names = [e.args["name"] for e in trace.of_kind("mark")]
    assert names[0] == "before" and "after" not in names


def test_a_partial_trace_reads_while_nothing_is_written_yet(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # a live read must not warn
        _write_log(tmp_path, 1)
        (tmp_path / "new.mpvlog").write_bytes(b"")         # a writer that just created its file
        trace = mt.trace.Trace(tmp_path)
        assert trace.refresh() == 2                        # process.start + the mark


def test_a_header_caught_half_written_is_read_at_the_next_poll(tmp_path):
    # A header with the magic but nothing else (a writer that stored the magic first, caught
    # mid-way; ours stores it last). A live read waits; the final read says what it skipped.
    _write_log(tmp_path, 1)
    (tmp_path / "half.mpvlog").write_bytes(recorder.MAGIC + bytes(recorder.HEADER_SIZE - len(recorder.MAGIC)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = mt.trace.Trace(tmp_path)
        assert trace.refresh() == 2
    with pytest.warns(TraceFormatWarning, match="header was never completed"):
        trace.refresh(final=True)
    assert len(trace.of_kind("mark")) == 1 and len(trace.problems) == 1
