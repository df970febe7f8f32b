"""Nothing sent is lost, nothing failed is kept: handles in flight, failed puts, closed queues.

* A ``file_system`` handle in a queue that a live process can still read must arrive, however
  long after its sender exited or was killed (the shm manager keeps the name).
* Once the queue that carried undelivered handles is gone in every live process, their names
  go (within ~3 s), even while a long-lived process keeps the manager busy.
* A put that fails half-way gives back every count and fd offer it took.
* A Queue used after ``close()`` says which call and why.
"""
import gc
import os

import pytest

import mpviz
import mpviz.multiprocessing as mp
from mpviz.multiprocessing import queues
from mpviz.sharing import fd_passing, file_system

from conftest import open_fds, shm_entries

pytestmark = pytest.mark.timeout(120)


# -- a put that fails gives back what it took -----------------------------------------------------

def _failing_puts(q, n):
    """`n` puts of (a fresh tensor, a lambda): each shares the tensor, then fails on the lambda."""
    errors = set()
    for _ in range(n):
        t = mpviz.zeros(10)
        try:
            q.put((t, lambda: 0))
        except Exception as e:                    # noqa: BLE001 - the test looks at which
            errors.add(type(e).__name__)
        del t
    return errors


def test_a_failed_put_gives_back_every_count_and_fd_it_took(strategy):
    q = mp.get_context("fork").Queue()
    _failing_puts(q, 1)                           # the fd server and manager connection start
    gc.collect()
    names, fds, offers = set(shm_entries()), open_fds(), fd_passing.pending_offers()
    errors = _failing_puts(q, 200)
    gc.collect()
    # each put refused, as before (a lambda: PicklingError, or AttributeError for a local one)
    assert len(errors) == 1 and errors <= {"PicklingError", "AttributeError"}, errors
    assert sorted(set(shm_entries()) - names) == [], "names left in /dev/shm"
    assert len(open_fds() - fds) == 0, "descriptors left open"
    assert fd_passing.pending_offers() == offers == 0, "fd offers nobody will fetch"
    q.close()
    q.join_thread()


def test_a_failed_put_leaves_the_tensors_count_as_it_was(strategy):
    q = mp.get_context("fork").Queue()
    t = mpviz.arange(4.0).share_memory_()
    segment = t.untyped_storage()._segment
    with pytest.raises(Exception):
        q.put((t, lambda: 0))
    assert file_system.refcount(segment.name) == 1 if strategy == "file_system" else \
        segment.refcount() == 1                   # ours alone: the dead handle's is given back
    q.put(t)                                      # and the tensor still travels
    assert q.get(timeout=10).tolist() == [0.0, 1.0, 2.0, 3.0]
    q.close()
    q.join_thread()


# -- a Queue used after close() -----------------------------------------------------------------

@pytest.mark.parametrize("call, use", [
    ("put", lambda q: q.put(1)),
    ("put_nowait", lambda q: q.put_nowait(1)),
    ("get", lambda q: q.get()),
    ("get_nowait", lambda q: q.get_nowait()),
    ("empty", lambda q: q.empty()),
])
def test_a_queue_used_after_close_names_the_call_and_why(call, use):
    q = mp.get_context("fork").Queue()
    q.close()
    q.join_thread()
    with pytest.raises(queues.QueueClosedError, match=rf"Queue\.{call}\(\) on .* closed: "
                       r"close\(\) .*Fix: ") as info:
        use(q)
    assert isinstance(info.value, ValueError) and info.value.call == call
    import pickle
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)
