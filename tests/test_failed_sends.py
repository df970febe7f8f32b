"""A send that fails half-way gives back what its handles took, on every channel multiprocessing
has.

Pickling a shared tensor makes a handle that takes something for its receiver: a count in the
segment's header, and under ``file_descriptor`` an fd offer on the sender's fd server. A message
such as ``(t, fresh, lambda: 0)`` shares ``t`` and ``fresh``, makes their handles, then fails on
the lambda: nobody will ever receive those handles, so what they took must be given back, or the
segment outlives everybody (a name left in /dev/shm, a descriptor open for ever in the fd server).

mpviz's own Queue did so already (test_inflight.py); here, every other channel, under both
strategies: ``Connection.send`` (a Pipe), ``SimpleQueue.put`` (mpviz's context's and the
stdlib's), ``Pool`` task arguments (parent) and results (worker), and Process arguments under
spawn and forkserver (fork pickles none). Each test makes 100 failed sends, checks that nothing
is left (names, descriptors, offers, the tensor's count), then makes a good send of the same
tensor and checks that a real child got it, in the very memory the parent has. And the very first
message of a fresh program gives back too (the scope is there before any handle is made).
"""
import gc
import multiprocessing
import os
import time

import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.sharing import fd_passing

from conftest import open_fds, shm_entries

pytestmark = pytest.mark.timeout(120)

SENDS = 100
EXPECTED = [0.0, 1.0, 2.0, 3.0]
MARK = 42.0     # what a child writes into t[0]: the parent sees it only if they share the memory


# -- in the children (module level: a spawned child imports them) -------------------------------

def check_and_mark(t, expected):
    """Return whether `t` arrived intact; mark it, in the shared memory, for the parent."""
    intact = t.tolist() == expected
    t[0] = MARK
    return intact


def check_and_mark_exit(t, expected):
    """As check_and_mark, for a Process: the answer is the exit code (0: intact)."""
    raise SystemExit(0 if check_and_mark(t, expected) else 1)


def recv_check_and_mark(conn):
    """A Pipe's child: receive one tensor, answer whether it arrived intact."""
    conn.send(check_and_mark(conn.recv(), EXPECTED))


def get_check_and_mark(inbox, outbox):
    """A SimpleQueue's child: as recv_check_and_mark."""
    outbox.put(check_and_mark(inbox.get(), EXPECTED))


def unpicklable_result(t):
    """A Pool task whose result shares `t` and a new tensor, then cannot be pickled."""
    return t, mpviz.zeros(3), lambda: 0


def echo(t):
    return t


# -- the checks ------------------------------------------------------------------------------------

def _shared_tensor():
    return mpviz.tensor(EXPECTED).share_memory_()


def _failing_sends(send, t, n=SENDS):
    """`n` sends of (t, a fresh tensor, a lambda): each shares both tensors, then fails."""
    errors = set()
    for _ in range(n):
        fresh = mpviz.zeros(3)
        try:
            send((t, fresh, lambda: 0))
        except Exception as e:                    # noqa: BLE001 - the test looks at which
            errors.add(type(e).__name__)
        del fresh
    return errors


def check_failed_sends(send, t):
    """100 failed sends of `t` by `send` leave this process with nothing more than it had: no
    names in /dev/shm, no descriptors, no fd offers, and t's count as it was."""
    segment = t.untyped_storage()._segment
    _failing_sends(send, t, 1)                    # the fd server and manager connection start
    gc.collect()
    names, fds = set(shm_entries()), open_fds()
    offers, count = fd_passing.pending_offers(), segment.refcount()
    errors = _failing_sends(send, t)
    # each send refused, as before (a lambda: PicklingError, or AttributeError for a local one)
    assert len(errors) == 1 and errors <= {"PicklingError", "AttributeError"}, errors
    assert _settles(lambda: sorted(set(shm_entries()) - names), []), "names left in /dev/shm"
    assert _settles(lambda: open_fds() - fds, set()), "descriptors left open"
    assert _settles(fd_passing.pending_offers, offers) and offers == 0, \
        "fd offers nobody will fetch"
    assert _settles(segment.refcount, count) and count == 1, \
        "counts for handles that never travelled"


def _settles(read, value, seconds=5):
    """Whether read() comes to `value` within `seconds`. Another thread or process may still
    hold the last message a moment: a Pool's task thread drops the task it failed to send just
    after the caller hears of it; a worker lets go of what it received once its task is done;
    file_system keeps a storage it sent a few ms more."""
    deadline = time.monotonic() + seconds
    while True:
        gc.collect()
        if read() == value:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)        # polling another thread's cleanup, bounded; not synchronisation


# -- Pipe: Connection.send ------------------------------------------------------------------------

def test_a_failed_pipe_send_gives_back_what_it_took(strategy):
    ctx = mp.get_context("fork")
    t = _shared_tensor()
    parent, child = ctx.Pipe()
    check_failed_sends(parent.send, t)

    p = ctx.Process(target=recv_check_and_mark, args=(child,))
    p.start()
    parent.send(t)                                # a good send of the same tensor
    assert parent.recv() is True, "the tensor arrived changed"
    p.join(30)
    assert p.exitcode == 0 and t[0].item() == MARK
    parent.close()
    child.close()


# -- SimpleQueue.put: mpviz's context's, and the stdlib's ------------------------------------------

@pytest.mark.parametrize("library", ["mpviz", "stdlib"])
def test_a_failed_simple_queue_put_gives_back_what_it_took(strategy, library):
    ctx = (mp if library == "mpviz" else multiprocessing).get_context("fork")
    t = _shared_tensor()
    inbox, outbox = ctx.SimpleQueue(), ctx.SimpleQueue()
    check_failed_sends(inbox.put, t)

    p = ctx.Process(target=get_check_and_mark, args=(inbox, outbox))
    p.start()
    inbox.put(t)
    assert outbox.get() is True, "the tensor arrived changed"
    p.join(30)
    assert p.exitcode == 0 and t[0].item() == MARK
    inbox.close()
    outbox.close()


# -- Pool: a task's arguments (pickled in the parent) and its result (in the worker) -------------

def test_a_pool_task_with_an_unpicklable_argument_gives_back_what_it_took(strategy):
    with mp.get_context("fork").Pool(1) as pool:
        t = _shared_tensor()                      # after the fork: the worker does not hold it
        # the Pool's task thread pickles each task; apply_async's result raises its error
        check_failed_sends(lambda message: pool.apply_async(echo, message).get(30), t)
        assert pool.apply_async(check_and_mark, (t, EXPECTED)).get(30) is True
    assert t[0].item() == MARK


def _fds_of(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_pool_result_that_cannot_be_pickled_gives_back_what_the_worker_took(strategy):
    with mp.get_context("fork").Pool(1) as pool:
        worker = pool._pool[0].pid
        t = _shared_tensor()                      # after the fork: the worker does not hold it
        segment = t.untyped_storage()._segment
        assert pool.apply_async(echo, (t,)).get(30).tolist() == EXPECTED  # its channels open
        gc.collect()
        names = set(shm_entries())
        assert _settles(segment.refcount, 1), "the worker still counts t after a good round trip"
        fds = _fds_of(worker)
        errors = set()
        for _ in range(SENDS):
            try:
                pool.apply_async(unpicklable_result, (t,)).get(30)
            except Exception as e:                # noqa: BLE001 - the test looks at which
                errors.add(type(e).__name__)
        # the worker sends MaybeEncodingError instead of its result, as ever
        assert errors == {"MaybeEncodingError"}, errors
        # its 100 failed results left no count on t, no names, and no fd offer in its fd server
        assert _settles(segment.refcount, 1), f"t's count is {segment.refcount()}, not 1"
        assert _settles(lambda: sorted(set(shm_entries()) - names), []), "names left in /dev/shm"
        assert _settles(lambda: _fds_of(worker), fds), "descriptors left open in the worker"
        assert pool.apply_async(check_and_mark, (t, EXPECTED)).get(30) is True
        assert pool.apply_async(echo, (t,)).get(30).tolist() == [MARK] + EXPECTED[1:]
        # (A terminate() that kills the worker while it gives its count back is
        # test_inflight.py's holder-killed test; here the worker ends by itself.)
        pool.close()
        pool.join()


# -- Process arguments: pickled under spawn and forkserver (fork pickles none) -------------------

@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_process_that_cannot_start_gives_back_what_its_arguments_took(strategy, method):
    ctx = mp.get_context(method)
    t = _shared_tensor()
    check_failed_sends(lambda message: ctx.Process(target=check_and_mark_exit,
                                                   args=message).start(), t)

    p = ctx.Process(target=check_and_mark_exit, args=(t, EXPECTED))
    p.start()
    p.join(60)
    assert p.exitcode == 0, "the tensor arrived changed"
    assert t[0].item() == MARK


# -- the very first message of a program that never imported mpviz.multiprocessing ---------------

FIRST_MESSAGE = """
import multiprocessing, sys
import mpviz                                   # mpviz.multiprocessing is not imported (yet)
from mpviz.sharing import fd_passing, set_sharing_strategy
set_sharing_strategy(sys.argv[1])
t = mpviz.arange(4.0).share_memory_()
a, b = multiprocessing.Pipe()
try:
    a.send((t, lambda: 0))                     # its first handle ever: the reducers load now
except Exception as e:
    print(type(e).__name__)
print(t.untyped_storage()._segment.refcount(), fd_passing.pending_offers())
"""


def test_the_first_message_a_program_sends_gives_back_too(strategy):
    """The scope is installed when mpviz.storage is imported, not when the first handle loads
    the reducers: by then the first message would be half-pickled, with no scope to give back."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FIRST_MESSAGE, strategy], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[0] in {"PicklingError", "AttributeError"}, out
    assert out[1:] == ["1", "0"], f"t's count {out[1]} (1: ours alone), fd offers {out[2]} (0)"


# -- the trace: an offer taken back is not a later message's ---------------------------------------

def test_a_withdrawn_fd_offer_is_recorded_and_linked_to_no_message():
    # The failed send's fd.offer was recorded while pickling; the next message of the same
    # thread once took its token as its own (an fd hand-over that never happened, put on a
    # message that carried none). The withdraw is an event, and the offer goes with it.
    import mpviz.trace as mt
    from mpviz.trace.analysis import _index
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_descriptor")
    a, b = mp.get_context("fork").Pipe()
    try:
        with mt.record() as trace:
            t = _shared_tensor()
            with pytest.raises(Exception):
                a.send((t, lambda: 0))
            a.send("plain")
            assert b.recv() == "plain"
            a.send(t)
            assert b.recv().tolist() == EXPECTED
    finally:
        a.close()
        b.close()
        mp.set_sharing_strategy(old)
    (offer_failed, offer_sent) = trace.of_kind("fd.offer")
    (withdrawn,) = trace.of_kind("fd.withdraw")
    assert withdrawn.args["token"] == offer_failed.args["token"]
    links = _index(trace).fd_messages
    assert (os.getpid(), offer_failed.args["token"]) not in links, links
    assert list(links) == [(os.getpid(), offer_sent.args["token"])], links
