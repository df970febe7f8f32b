"""A program's own Pipe: its recv() with nothing to read, and its send() into a full pipe, are
waits a verdict follows to whoever holds the other end (mpviz/trace/waits.py, issue 27).

The programs hang as their authors wrote them, and run through ``python -m mpviz trace
--hang-after 1.5`` as a learner runs them, all at once (they spend their time waiting):

    pipe_ping_pong.py fork/spawn  both ends recv() first: each waits for the other, a cycle
    pipe_never_sent.py            a worker forgets to send on a one-way Pipe and ends; the
                                  parent's recv() waits for ever
    pipe_threads_no_serve.py      two threads of one process, each given one end: both recv()
    pipe_sender_raised.py         a worker raises before its send_bytes(); recv_bytes() waits
    greeting_never_sent.py        the docs' Listener and Client (AF_INET, AF_UNIX): the server
                                  waits for a request, the client for a greeting: a cycle
    wait_readers_not_closed.py    the docs' connection.wait() example without its w.close():
                                  wait(readers) never sees an end of file
    result_joined_first.py        a worker sends a big result; the parent joins it first

and one that does not hang: a ping-pong of 200 small messages and 30 big ones beside a Pool and
a Queue, whose waits all end, whose two directions are one "Pipe 1", whose library pipes are not
the program's, and which is stuck for good at no instant.
"""
import os
import re
import sys
import textwrap

import pytest

import mpviz.trace as mt
from mpviz.trace import names
from test_hang_classes import hung, result, together, trace

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hang_programs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{program: result} of the hanging programs above, run at once."""
    return together(tmp_path_factory, {
        "ping-pong fork": ("1.5", os.path.join(PROGRAMS, "pipe_ping_pong.py"), "fork"),
        "ping-pong spawn": ("1.5", os.path.join(PROGRAMS, "pipe_ping_pong.py"), "spawn"),
        "never sent": ("1.5", os.path.join(PROGRAMS, "pipe_never_sent.py")),
        "big send": ("1.5", os.path.join(PROGRAMS, "result_joined_first.py")),
        "threads": ("1.5", os.path.join(PROGRAMS, "pipe_threads_no_serve.py")),
        "sender raised": ("1.5", os.path.join(PROGRAMS, "pipe_sender_raised.py")),
        "wait readers": ("1.5", os.path.join(PROGRAMS, "wait_readers_not_closed.py")),
        "wait readers spawn": ("1.5", os.path.join(PROGRAMS, "wait_readers_not_closed.py"),
                               "spawn"),
        "greeting AF_INET": ("1.5", os.path.join(PROGRAMS, "greeting_never_sent.py"), "AF_INET"),
        "greeting AF_UNIX": ("1.5", os.path.join(PROGRAMS, "greeting_never_sent.py"), "AF_UNIX")})


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_two_ends_that_both_recv_first_wait_for_each_other_in_a_cycle(runs, method):
    # Said before: "the trace recorded no wait that was still open".
    err = hung(result(runs, f"ping-pong {method}"))
    assert ("pipe_ping_pong.py's main thread waits: recv() on Pipe 1: nothing in it yet -- "
            "Process-1's main thread must send") in err, err
    assert ("Process-1's main thread waits: recv() on Pipe 1: nothing in it yet -- "
            "pipe_ping_pong.py's main thread must send") in err, err
    assert ("STUCK FOR GOOD: a cycle: pipe_ping_pong.py's main thread waits in recv() on Pipe 1 "
            "for Process-1's main thread to send; Process-1's main thread waits in recv() on "
            "Pipe 1 for pipe_ping_pong.py's main thread to send. Each waits for the next: none "
            "can go on. Both ends of Pipe 1 wait to receive, and neither sent first. Fix: agree "
            "on who speaks first") in err, err
    assert "conn-" not in err, err                   # (an end's id is no word for a learner)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("family", ["AF_INET", "AF_UNIX"])
def test_a_listener_and_a_client_that_both_recv_first_are_a_cycle_on_their_connection(runs,
                                                                                      family):
    # Said before: "the trace recorded no wait that was still open" -- a Listener/Client
    # connection's recv() was no recorded wait, and its two ends were no one channel.
    err = hung(result(runs, f"greeting {family}"))
    assert ("Process-1's main thread waits: recv() on Connection 1: nothing in it yet -- "
            "greeting_never_sent.py's main thread must send") in err, err
    assert ("greeting_never_sent.py's main thread waits: recv() on Connection 1: nothing in it "
            "yet -- Process-1's main thread must send") in err, err
    assert re.search(r"STUCK FOR GOOD: a cycle: (greeting_never_sent\.py's main thread|Process-1's "
                     r"main thread) waits in recv\(\) on Connection 1 .*Each waits for the next: "
                     r"none can go on\. Both ends of Connection 1 wait to receive, and neither "
                     r"sent first\. Fix: agree on who speaks first -- one side sends \(its "
                     r"request, a greeting\) before its first recv\(\)", err), err
    assert "conn-" not in err and "recorded no wait" not in err, err


@pytest.mark.timeout(150)
def test_two_threads_given_the_two_ends_wait_for_each_other_not_for_the_thread_that_made_it(runs):
    # The main thread made the Pipe, but it gave each end to a thread and waits in join().
    err = hung(result(runs, "threads"))
    assert ("pipe_threads_no_serve.py's alice waits: recv() on Pipe 1: nothing in it yet -- "
            "pipe_threads_no_serve.py's bob must send") in err, err
    assert ("pipe_threads_no_serve.py's bob waits: recv() on Pipe 1: nothing in it yet -- "
            "pipe_threads_no_serve.py's alice must send") in err, err
    assert ("STUCK FOR GOOD: a cycle: pipe_threads_no_serve.py's alice waits in recv() on Pipe 1 "
            "for pipe_threads_no_serve.py's bob to send; pipe_threads_no_serve.py's bob waits in "
            "recv() on Pipe 1 for pipe_threads_no_serve.py's alice to send.") in err, err
    assert "main thread must send" not in err, err


@pytest.mark.timeout(150)
def test_a_recv_whose_only_sender_ended_without_sending_names_it_and_how_it_ended(runs):
    err = hung(result(runs, "never sent"))
    assert ("pipe_never_sent.py's main thread waits: recv() on Pipe 1: nothing in it yet -- "
            "Process-1's main thread must send -- but it has ended. A recv() raises EOFError "
            "only once no process holds the Pipe's other end open any more") in err, err
    assert "after p.start(), close() the end given to the child" in err, err
    assert "STUCK FOR GOOD" not in err, err       # (no cycle: a sender that ended is no wait)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["wait readers", "wait readers spawn"])
def test_connection_wait_over_pipes_whose_writers_the_parent_kept_names_them_and_the_fix(runs,
                                                                                       name):
    # Said before: "the trace recorded no wait that was still open" (connection.wait() was
    # no recorded wait), with only the stack's `for r in wait(readers):`.
    # Which Pipes hang is CPython's: `r, w = Pipe()` rebinds w, and the Connection dropped
    # closes its end; only the last w, still bound, stays open in the parent. So Pipes 1-3
    # reach their end of file and the wait is on the 4th alone (untraced too: a traced run
    # once kept every w open -- mpviz's look at the Process's arguments held them in a cycle).
    err = hung(result(runs, name))
    found = re.search(r"wait_readers_not_closed\.py's main thread waits: wait\(\) on (Pipe \d): "
                      r"nothing in it yet -- (Process-\d)'s main thread must send -- but it has "
                      r"ended\. wait\(\) reports a Pipe's end ready at its end of file \(so that "
                      r"recv\(\) raises EOFError\) only once no process holds that Pipe's other "
                      r"end open any more", err)
    assert found and found.group(2) == "Process-4", err
    assert "after p.start(), close() the end given to the child (w.close())" in err, err
    assert "the trace recorded no wait that was still open" not in err, err


def test_looking_at_a_processs_arguments_keeps_none_of_them_alive():
    """The recorder looks at a Process's arguments before start() (the queues and Pipe ends it
    is given); that look must hold none of them once done -- by reference counting alone, no
    garbage collection: a Pipe end the program drops must close then, as it does untraced."""
    import gc
    import multiprocessing as stdlib_mp
    import weakref
    from mpviz.trace import hooks
    r, w = stdlib_mp.Pipe(duplex=False)
    p = stdlib_mp.Process(target=print, args=(w, [w], {"w": w}), kwargs={"end": w})
    gone = weakref.ref(w)
    gc.disable()
    try:
        assert hooks._in_arguments(p).count(w) == 4
        del p, w
        assert gone() is None
    finally:
        gc.enable()
        r.close()


WAIT_READERS_CLOSED = open(os.path.join(PROGRAMS, "wait_readers_not_closed.py")).read().replace(
    "        p.start()\n", "        p.start()\n        w.close()\n")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_docs_connection_wait_example_ends_with_each_wait_ended(tmp_path, method):
    """The docs' example as written (the parent closes each w): it ends, and every wait() it
    recorded ended too -- no verdict, nothing stuck at any instant."""
    assert "w.close()\n" in WAIT_READERS_CLOSED
    run = trace(tmp_path, WAIT_READERS_CLOSED, method)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("Process-") == 40, run.stdout
    assert "HANG" not in run.stderr and "waits:" not in run.stderr, run.stderr
    t = mt.load(re.search(r"recording into (\S+) ", run.stderr).group(1))
    waits = [e for e in t.of_kind("wait.begin") if e.args.get("call") == "wait"]
    ends = [e for e in t.of_kind("wait.end") if e.args.get("on") == "pipe.recv"]
    assert len(ends) >= len(waits), (waits, ends)
    from mpviz.trace import analysis as st
    assert not [b for b in st.state_at(t).blocked if b.on == "pipe.recv"]


@pytest.mark.timeout(150)
def test_a_recv_bytes_whose_sender_raised_is_said_as_recv_bytes_with_the_error(runs):
    err = hung(result(runs, "sender raised"))
    assert ("pipe_sender_raised.py's main thread waits: recv_bytes() on Pipe 1: nothing in it "
            "yet -- Process-1's main thread must send -- but it has ended.") in err, err
    assert ("ENDED BY AN ERROR: Process-1 ended (exit 1, after FileNotFoundError: [Errno 2] No "
            "such file or directory: '/nonexistent/weights.bin'") in err, err


@pytest.mark.timeout(150)
def test_a_big_send_into_a_pipe_nobody_reads_is_a_wait_in_a_cycle_with_the_join(runs):
    # Said before: the join's line, and nothing of the send (no wait was recorded).
    err = hung(result(runs, "big send"))
    assert ("Process-1's main thread waits: write 4.65 MiB into the full Pipe 1 -- "
            "result_joined_first.py's main thread must recv") in err, err
    assert ("STUCK FOR GOOD: a cycle: result_joined_first.py's main thread waits in join() for "
            "Process-1 to exit; Process-1's main thread waits in send() into the full Pipe 1 for "
            "result_joined_first.py's main thread to recv. Each waits for the next: none can go "
            "on") in err, err


PING_PONG_BESIDE_A_POOL = """
    import multiprocessing as mp

    def echo(conn):
        while True:
            n = conn.recv()
            if n is None:
                break
            conn.send(n + 1 if isinstance(n, int) else n)

    def square(x):
        return x * x

    if __name__ == "__main__":
        mp.set_start_method("fork")
        here, there = mp.Pipe()
        p = mp.Process(target=echo, args=(there,))
        p.start()
        for i in range(200):
            here.send(i)
            assert here.recv() == i + 1
        big = bytes(2_000_000)                # more than a socket holds: sends that wait
        for i in range(30):
            here.send(big)
            assert len(here.recv()) == len(big)
        here.send(None)
        p.join()
        q = mp.Queue()
        q.put(1)
        q.get()
        with mp.Pool(2) as pool:
            print(sum(pool.map(square, range(20))))
"""


@pytest.mark.timeout(90)
def test_a_ping_pong_that_ends_has_every_recv_wait_ended_and_one_name_for_its_pipe(tmp_path):
    run = trace(tmp_path, PING_PONG_BESIDE_A_POOL)
    assert run.returncode == 0, run.stderr
    t = mt.load(str(tmp_path / "out"))
    opened = t.of_kind("pipe.open")
    assert len(opened) == 1, opened         # the program's Pipe only: not the Pool's, the Queue's
    ends = opened[0].args["ends"]
    begins = [e for e in t.of_kind("wait.begin") if e.args["on"] == "pipe.recv"]
    ended = [e for e in t.of_kind("wait.end") if e.args["on"] == "pipe.recv"]
    assert begins and {e.args["id"] for e in begins} <= set(ends), begins
    assert len(ended) == len(begins), (len(ended), len(begins))    # every one ended
    sends = {e.args["pipe"] for e in t.of_kind("pipe.send")}
    assert set(ends) <= sends, sends        # sent on each end: two directions ...
    channels, _ = names.for_trace(t)
    assert {channels[end] for end in ends} == {"Pipe 1"}, channels   # ... one Pipe
    sends = [e for e in t.of_kind("wait.begin") if e.args["on"] == "pipe.send"]
    assert sends and all(e.args["nbytes"] > 2_000_000 for e in sends), sends  # the big ones only
    state = mt.analysis.state_at(t)
    assert not state.blocked and not state.deadlocks, state.text()
    # At no instant is the ping-pong stuck for good: both ends can be inside a big send() for a
    # moment (one's write is read, its wait's end not yet written), a cycle that ends.
    for e in t.of_kind("wait.begin"):
        state = mt.analysis.state_at(t, e.ts_ns)
        assert not state.deadlocks, state.text()


DOCS_LISTENER_CLIENT = """
import multiprocessing
from array import array
from multiprocessing.connection import Client, Listener

def serve(listener):
    with listener.accept() as conn:
        print('connection accepted from', listener.last_accepted)
        conn.send([2.25, None, 'junk', float])
        conn.send_bytes(b'hello')
        conn.send_bytes(array('i', [42, 1729]))

if __name__ == '__main__':
    with multiprocessing.Manager() as manager:          # (its own connections: not the program's)
        seen = manager.list()
        with Listener(('localhost', 0), authkey=b'secret password') as listener:
            server = multiprocessing.Process(target=serve, args=(listener,))
            server.start()
            with Client(listener.address, authkey=b'secret password') as conn:
                seen.append(conn.recv())
                seen.append(conn.recv_bytes())
                arr = array('i', [0, 0, 0, 0, 0])
                print(conn.recv_bytes_into(arr), arr, list(seen))
            server.join()
"""


@pytest.mark.timeout(90)
def test_the_docs_listener_and_client_are_one_connection_whose_waits_all_end(tmp_path):
    run = trace(tmp_path, DOCS_LISTENER_CLIENT)
    assert run.returncode == 0, run.stderr
    assert "8 array('i', [42, 1729, 0, 0, 0])" in run.stdout, run.stdout
    t = mt.load(str(tmp_path / "out"))
    opened = t.of_kind("pipe.open")                 # one from each side, the Manager's none
    server_end, client_end = _one_connection(opened)
    assert len({e.pid for e in opened}) == 2
    assert {e.args["pipe"] for e in t.of_kind("pipe.send")
            if e.args["pipe"] in (server_end, client_end)} == {server_end}   # (only the server)
    channels, _ = names.for_trace(t)
    assert channels[server_end] == "Connection 1", channels
    state = mt.analysis.state_at(t)
    assert not state.blocked and not state.deadlocks, state.text()


LATE_ACCEPT = """
import time
from multiprocessing import get_context
from multiprocessing.connection import Client, Listener

def serve(listener):
    time.sleep(0.6)                      # busy before it takes its first caller
    with listener.accept() as conn:
        conn.send("hello")

if __name__ == '__main__':
    with Listener(('localhost', 0)) as listener:
        server = get_context('fork').Process(target=serve, args=(listener,))
        server.start()
        with Client(listener.address) as conn:
            print(conn.recv())
        server.join()
"""


@pytest.mark.timeout(90)
def test_a_client_whose_listener_accepts_late_is_still_paired(tmp_path):
    """Without an authkey, Client() returns once connected, before the listener's accept():
    /proc/net/tcp shows its other end with inode 0 until then. Its pairing waited 200 ms and
    gave up -- on a busy machine (a fresh-clone run) the Client end was left unrecorded, and
    its recv() was drawn on no connection. Here the server accepts 0.6 s late."""
    run = trace(tmp_path, LATE_ACCEPT)
    assert run.returncode == 0 and "hello" in run.stdout, run.stderr
    t = mt.load(str(tmp_path / "out"))
    server_end, client_end = _one_connection(t.of_kind("pipe.open"))
    channels, _ = names.for_trace(t)
    assert channels[server_end] == "Connection 1", channels
    assert names.pipe_ends(t.events)[client_end] == (server_end, client_end)   # (joined)
    waits = [e for e in t.of_kind("wait.begin") if e.args["on"] == "pipe.recv"]
    assert [e.args["id"] for e in waits] == [client_end], waits   # the Client's recv()


def _one_connection(opened):
    """(the server's end, the Client's end) of the one connection two pipe.open events (an
    accept() and a Client()) record: each names its own end first; the accept() side names the
    Client's end too, and the Client side names the server's end when it saw it (a server that
    accepts late, or sends and closes at once, leaves it its own end alone: waits.py)."""
    assert sorted(e.args["connect"] for e in opened) == ["Client", "accept"], opened
    accept = next(e.args["ends"] for e in opened if e.args["connect"] == "accept")
    client = next(e.args["ends"] for e in opened if e.args["connect"] == "Client")
    assert len(accept) == 2 and client[0] == accept[1], opened
    assert client[1:] in ([], [accept[0]]), opened
    return accept[0], accept[1]
