"""A hang's verdict in words: what kind of hang, where each thread is, why it cannot move.

The watchdog (watchdog.py) decides *that* a program hangs from what each thread waits on
(osview.threads); this module says it so that a learner can act on it:

    headline            DEADLOCK (one process can never move, or nobody can) or STALLED
                        (waits with a deadline longer than --hang-after), how long, what was done
    each thread         "ForkPoolWorker-2 (pid 7), main thread: waits for a lock of its own
                        process, with no time limit, for 1.6 s -- at task (prog.py:21):
                        `log.info(...)`"  -- the call from /proc, the line from its Python stack
    why (one process)   forked while Python threads of its parent ran: a lock one of them held
                        is copied held, and the thread that would release it is not copied;
                        forked after native threads (a thread pool Python did not start, such
                        as torch's OpenMP threads): the child waits for threads it does not have
    chains              a DataLoader's main thread waits for a batch -- from the worker that
                        sleeps, or waits for ever, in its dataset's ``__getitem__``

The names are the trace's (``ForkPoolWorker-2``, "DataLoader worker 0"); thread names come from
the recorded ``thread.start`` events; a thread with none, in a process's memory but not started
by Python, is a "native thread".
"""
import linecache
import os
import sysconfig

from . import osview
from .analysis import (_index, errors_before, how_it_ended, manager_servers, process_labels,
                       puts_into_their_own, state_at, stuck_moment, terminated_job)
from .names import is_thread_lock, join_and, line_words

FORK_FIX = ("start the children with 'spawn' or 'forkserver' "
            "(multiprocessing.get_context('forkserver'), or a Pool's context=...): a fresh "
            "interpreter has no lock copied while held, and no thread missing; or fork before "
            "any thread starts")
MAX_THREAD_LINES = 24       # a program of many processes: the first ones, then a count
NATIVE_FIX = "or call torch.set_num_threads(1) before forking (no OpenMP threads to lose)"


def headline(watchdog, nkilled):
    """The verdict's first lines: the kind of hang and what mpviz did."""
    t, stop = watchdog.stalled_for, (f"mpviz stopped {nkilled} process(es) with SIGKILL.")
    if watchdog.stuck_pids:
        names = _names(watchdog.trace, watchdog)
        who = join_and([_who(watchdog.trace, names, p) for p in watchdog.stuck_pids])
        it = "it" if len(watchdog.stuck_pids) == 1 else "each"
        return [f"mpviz trace: HANG: DEADLOCK -- {who} can never move: for {t:.1f} s every "
                f"thread of {it} has waited, with no time limit, for a lock in its own memory "
                f"(a private futex), which only a thread of that same process could release "
                f"-- and none of them can (only a signal handler still could). CPU used by "
                f"other threads or processes does not change that. {stop}"]
    if watchdog.churn is not None:
        died, (pid, tid) = watchdog.churn
        names, trace = _names(watchdog.trace, watchdog), watchdog.trace
        how = how_it_ended(trace, died[-1].pid)
        return [f"mpviz trace: HANG: DEADLOCK -- {_thread_who(trace, names, (pid, tid))} waits "
                f"for a Pool's results that can never come: in the last "
                f"{watchdog.hang_after:g} s {len(died)} of the Pool's workers ended, each before "
                f"it ran a task (the last: {how}). A Pool replaces a worker that ends, "
                f"for ever, and does not say why (CPython gh-87472): processes come and go, "
                f"nothing is done. Fix: make the initializer work (or catch its error and "
                f"report it), or use concurrent.futures.ProcessPoolExecutor, which raises "
                f"BrokenProcessPool when an initializer fails. {stop}"]
    if watchdog.broken is not None:
        e, names = watchdog.broken, _names(watchdog.trace, watchdog)
        at = f", raised at {e.args['at']}" if e.args.get("at") else ""
        spin = _pool_spins(watchdog, names, e.pid, "waits for those results")
        return [f"mpviz trace: HANG: DEADLOCK -- {_who(watchdog.trace, names, e.pid)}'s Pool "
                f"can deliver no result any more: its result handler thread "
                f"(`{e.args.get('name')}`) ended with {e.args.get('error')}{at}. For {t:.1f} s "
                f"its main thread has waited, with no time limit, for what only that thread "
                f"could deliver: it can never move.{spin} {stop}"]
    if watchdog.handler_wait is not None:
        return _handler_waits_for_itself(watchdog, stop)
    if watchdog.for_good:
        # recorded lock waits that can never end, while other threads wait with a deadline
        names = _names(watchdog.trace, watchdog)
        who = join_and(list(dict.fromkeys(_thread_who(watchdog.trace, names, (d.pid, d.tid))
                                      for d in watchdog.for_good)))
        reasons = list(dict.fromkeys(d.reason for d in watchdog.for_good))
        return [f"mpviz trace: HANG: DEADLOCK -- {who} can never move: "
                f"{'; '.join(reasons)}. For {t:.1f} s no thread of any process moved and no "
                f"event was recorded; some threads wait with a deadline that has not run out "
                f"within --hang-after {watchdog.hang_after:g} s (they may still move -- that "
                f"frees none of the above). {stop}"]
    if watchdog.kind == "stalled":
        return [f"mpviz trace: HANG: STALLED -- for {t:.1f} s no thread of any process moved "
                f"and no event was recorded. Some threads wait with a deadline (a sleep, a "
                f"timeout) that has not run out within --hang-after {watchdog.hang_after:g} s: "
                f"a wait that ends within it is progress, one that does not is a stall: they "
                f"may still move, so mpviz does not call it a deadlock -- whether what the "
                f"others wait for ever comes, it cannot tell. {stop}"]
    servers = manager_servers(watchdog.trace)
    polls = [key for key, s in watchdog.seen.items() if s.again and key[0] not in servers
             and not getattr(s, "poller", False)]    # (torch.distributed's: watchdog.POLLERS)
    if polls:
        # A loop that polls wakes each time its timeout runs out: what it waits for did not
        # come, but the loop itself may still end (a deadline it checks, a count of tries) --
        # its code says, not its system calls. "Nobody can ever move" would be a guess.
        names = _names(watchdog.trace, watchdog)
        who = join_and([_thread_who(watchdog.trace, names, key) for key in polls])
        return [f"mpviz trace: HANG: DEADLOCK, unless a loop gives up by itself -- for "
                f"{t:.1f} s no thread of any process made progress and nothing was recorded but "
                f"waits that timed out and began again, "
                f"and every thread waits with no time limit, or waits again for the same thing "
                f"each time its timeout runs out (a loop that polls: the deadline passed and "
                f"nothing came). Nothing they wait for will come, as long as they all wait. "
                f"Only the polling loop of {who} can still end this, if its code stops "
                f"waiting by itself (a deadline, a number of tries); mpviz cannot tell whether "
                f"it does: read its line below. {stop}"]
    return [_everyone_waits(watchdog, servers, t, stop) + _pollers_said(watchdog)]


def _handler_waits_for_itself(watchdog, stop):
    """The headline of a Pool whose result handler thread waits inside a callback (watchdog's
    ``handler_wait``): it delivers no result while it waits -- the one it waits for too."""
    b, name = watchdog.handler_wait
    names = _names(watchdog.trace, watchdog)
    spin = _pool_spins(watchdog, names, b.pid, "finds results waiting that nobody takes")
    return [f"mpviz trace: HANG: DEADLOCK -- {_who(watchdog.trace, names, b.pid)}'s Pool can "
            f"deliver no result any more: its result handler thread (`{name}`), which runs "
            f"every callback=, is inside one that waits ({b.what}) -- and while it waits, "
            f"no result of the Pool is delivered, the one it waits for among them: it "
            f"waits for itself. The main thread, waiting for a result too, can never "
            f"move.{spin} Fix: a callback runs in the Pool's own thread: let it neither "
            f"wait nor block (no pool.apply(), no .get() there: submit the next stage with "
            f"apply_async from the main program, or from the callback without waiting). "
            f"{stop}"]


def _pool_spins(watchdog, names, pid, doing):
    """" Meanwhile prog.py's thread `Thread-1 (_handle_workers)` uses CPU: the Pool's own loop,
    which <doing>, and does nothing else.": the threads of process `pid` running (using CPU)
    while its Pool delivers nothing; "" if none is."""
    busy = [key for key, s in watchdog.seen.items()
            if key[0] == pid and s.view.wait == "running"]
    if not busy:
        return ""
    return (f" Meanwhile {join_and([_thread_who(watchdog.trace, names, k) for k in busy])} "
            f"{'uses' if len(busy) == 1 else 'use'} CPU: the Pool's own loop, which {doing}, "
            f"and does nothing else.")


def _pollers_said(watchdog):
    """" (In rank 0 (pid 12), gloo's threads ...)": the threads of a library that wake every
    few ms whatever comes (watchdog.POLLERS), said once: they are not the program's loops."""
    pids = sorted({k[0] for k, s in watchdog.seen.items() if getattr(s, "poller", False)})
    if not pids:
        return ""
    names = _names(watchdog.trace, watchdog)
    who = join_and([_who(watchdog.trace, names, pid) for pid in pids])
    return (f" (In {who}, torch.distributed's own threads (gloo's) wake every 10 ms to poll "
            f"their sockets: they deliver what another rank sends, and no rank here can send.)")


def _everyone_waits(watchdog, servers, t, stop):
    """The headline of a hang where every thread waits with no time limit -- but a Manager's
    server process's main thread, which wakes each second (its serve_forever checks whether the
    Manager is shut down): the Manager's own machinery, which ends no wait of the program."""
    if not servers:
        return (f"mpviz trace: HANG: DEADLOCK -- for {t:.1f} s no thread of any process moved "
                f"and no event was recorded, and every thread waits with no time limit (no "
                f"sleep, no timeout): nobody can ever move. {stop}")
    names, one = _names(watchdog.trace, watchdog), len(servers) == 1
    who = join_and([f"{names.get(pid, '?')} (pid {pid})" for pid in sorted(servers)])
    return (f"mpviz trace: HANG: DEADLOCK -- for {t:.1f} s no thread of any process moved and "
            f"no event was recorded, and every thread of the program waits with no time limit "
            f"(no sleep, no timeout): nobody can ever move. ({who}: "
            f"{'the Manager server process' if one else 'Manager server processes'}, which "
            f"keep{'s' * one} the Manager's objects and run{'s' * one} the calls made on them; "
            f"its main thread wakes each second to see whether the Manager is shut down, and "
            f"ends no wait of the program.) {stop}")


class Facts:
    """What /proc says at the moment of the verdict, read before the processes are killed:
    each thread's wait in words, how long it has waited, and each process's native threads."""

    def __init__(self, watchdog, now):
        self.words = {key: what(s.view._replace(wchan=osview.wchan(*key)))
                      for key, s in watchdog.seen.items()}
        self.waited = {key: now - s.since for key, s in watchdog.seen.items()}
        pids = {pid for pid, _ in watchdog.seen}
        self.native = {pid: [(v.tid, what(v._replace(wchan=osview.wchan(pid, v.tid))),
                              v.args[:1] if v.call == "futex" else None)
                             for v in _native_threads(watchdog.trace, pid)] for pid in pids}
        self.other_end = {}              # (pid, tid) -> the pids that hold the pipe's other end
        for key, s in watchdog.seen.items():
            v = s.view
            end = {"read": "write", "write": "read"}.get(v.call)
            target = osview.fd_target(v.pid, v.args[0]) if end and v.args else ""
            if target.startswith("pipe:"):
                self.other_end[key] = (end, osview.pipe_ends(sorted(pids), target)[end])


def threads_in_words(watchdog, stacks, chains=True):
    """Where each thread is (the stuck processes', or everyone's), chains, why, the fix.
    `chains` False (a Ctrl-C's report: nothing is judged stuck): where each thread is, only."""
    trace, seen, facts = watchdog.trace, watchdog.seen, watchdog.facts
    names, tnames = _names(trace, watchdog), _thread_names(trace)
    pids = watchdog.stuck_pids or sorted({pid for pid, _ in seen})
    lines = ["Where each thread is (from /proc/PID/task/TID: its system call, how long it has "
             "waited there):"]
    for pid in pids:
        frames = _stacks_by_thread(trace, pid, (stacks.get(pid) or {}).get("stacks", ""))
        for (p, tid), s in sorted(seen.items()):
            if p != pid:
                continue
            who = f"{_who(trace, names, pid)}, {tnames.get((pid, tid), _thread(pid, tid))}"
            line = f"  {who}: {facts.words[(pid, tid)]}"
            if s.view.wait != "running" and facts.waited[(pid, tid)] >= 0.05:
                line += f" for {facts.waited[(pid, tid)]:.1f} s"   # (unknown at a first look)
            if s.again:
                line += " (its timeout ran out, and it began the same wait again)"
            if (pid, tid) in facts.other_end:
                line += _other_end(trace, names, pid, *facts.other_end[(pid, tid)])
            own = own_line(frames.get(tid))
            lines.append(line + (f" -- at {own}" if own else ""))
    if len(lines) > MAX_THREAD_LINES + 1:
        more = len(lines) - 1 - MAX_THREAD_LINES
        lines[MAX_THREAD_LINES + 1:] = [f"  ... and {more} more thread(s): their stacks are below"]
    if chains:
        lines += _dataloader_chains(watchdog, stacks, names)
        lines += _full_pipe_cycles(watchdog, names)
        lines += _why(watchdog, stacks, names)
    return lines


FULL_PIPE_FIX = ("read what the child writes while it runs, then wait: with subprocess, "
                 "p.communicate() (its docs warn that p.wait() with stdout=PIPE deadlocks "
                 "once the output fills the pipe's 64 KiB), or a thread that reads")


def _full_pipe_cycles(watchdog, names):
    """A thread waits for a child to end (wait4 on its pid) while a thread of that child writes
    into a full pipe whose read end only the waiter's process holds: neither can go on. (A
    queue's feeder writing so is said by its recorded wait: not here.)"""
    trace, facts, lines = watchdog.trace, watchdog.facts, []
    recorded = {(b.pid, b.tid) for b in state_at(trace, stuck_moment(trace)).blocked
                if b.on == "pipe.write"}
    for (pid, tid), s in sorted(watchdog.seen.items()):
        if s.view.call != "wait4" or not s.view.args or not 0 < s.view.args[0] < 2 ** 31:
            continue
        child = s.view.args[0]
        for (cpid, ctid), (end, holders) in sorted(facts.other_end.items()):
            if cpid != child or end != "read" or (cpid, ctid) in recorded or \
                    pid not in holders or not set(holders) <= {pid, child}:
                continue
            lines.append(f"  STUCK FOR GOOD: {_thread_who(trace, names, (pid, tid))} waits for "
                         f"{_who(trace, names, child)} to end, and its "
                         f"{_thread_names(trace).get((cpid, ctid), _thread(cpid, ctid))} "
                         f"writes into a full pipe that only {_who(trace, names, pid)} can read "
                         f"-- after that wait, which never ends. Fix: {FULL_PIPE_FIX}.")
            break
    return lines


def what(view):
    """What a thread does, in words, from its ``osview.ThreadView``."""
    kernel = f", kernel: {view.wchan}" if view.wchan else ""
    if view.wait == "running":
        return "running (using CPU)"
    if view.wait == "sleep":
        return "in `time.sleep` (a deadline)"
    if view.wait == "terminal":
        return "reading the terminal (waits for you)"
    if view.call == "futex":
        if view.wait == "deadline":
            return f"waits for a lock or condition, with a timeout (futex{kernel})"
        whose = "of its own process" if view.private else "shared between processes"
        return f"waits for a lock {whose}, with no time limit (futex{kernel})"
    target = _fd_words(view) if view.call in ("read", "write", "recvfrom", "recvmsg",
                                               "sendto", "sendmsg", "accept", "accept4") else ""
    if view.call in ("read", "recvfrom", "recvmsg"):       # (socket.recv is recvfrom)
        return f"reads {target}, with no time limit"
    if view.call in ("write", "sendto", "sendmsg"):
        return f"writes into {target}, which is full, with no time limit"
    if view.call in ("wait4", "waitid"):
        return "waits for a child process to end (join, wait), with no time limit"
    if view.call in ("accept", "accept4"):
        return f"waits for a connection on {target}"
    if view.call in ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait",
                     "epoll_pwait2"):
        how = "with a timeout" if view.wait == "deadline" else "with no time limit"
        return f"waits for a pipe, socket or file to be ready ({view.call}, {how})"
    return f"in the system call {view.call}{kernel}"


def _other_end(trace, names, pid, end, holders):
    """"; its write end is open in X (pid 5) and in this process": who could end the wait of a
    thread that reads (writes) a pipe. Its own process counts: a thread of it could."""
    who = [("this process" if p == pid else _who(trace, names, p)) for p in holders]
    if not who:
        return (f"; its {end} end is open in no process of the program (one outside it "
                f"could {end})")
    return f"; its {end} end is open in {join_and(who)}"


def _fd_words(view):
    target = osview.fd_target(view.pid, view.args[0]) if view.args else ""
    kind = ("a pipe" if target.startswith("pipe:") else "a socket" if
            target.startswith("socket:") else target or "a file")
    return f"{kind} (fd {view.args[0]})" if view.args else kind


# --- names ------------------------------------------------------------------------------------

def _names(trace, watchdog=None):
    """``{pid: name}``: a DataLoader worker as "DataLoader worker N", others as labels() does,
    and a process the trace does not know as the helper it is ("Python's fork server"), where
    `watchdog` saw one."""
    from .watchdog import labels
    names = {pid: name for pid, name in (watchdog.helpers if watchdog else {}).items() if name}
    names.update(labels(trace))
    for e in trace.of_kind("wait.begin"):      # a child it does not record: Popen.wait's name
        if e.args.get("on") == "process" and e.args.get("name"):
            names.setdefault(e.args.get("id"), e.args["name"])
    for e in trace.of_kind("dataloader.worker"):
        if e.args.get("phase") == "start":
            names[e.pid] = f"DataLoader worker {e.args.get('worker_id')}"
    return names


def _who(trace, names, pid):
    """"ForkPoolWorker-2 (worker 1, pid 7)": the process's name and, where the pictures and the
    wait lines call it otherwise ("worker 1 is idle"), that name too; "Process-1 (pid 7)"."""
    alias = process_labels(trace).get(pid)
    name = names.get(pid, "?")
    if pid in manager_servers(trace):
        return f"{name} (the Manager's server process, pid {pid})"
    return f"{name} ({alias}, pid {pid})" if alias and alias != name else f"{name} (pid {pid})"


def _thread_who(trace, names, key):
    """"Process-1 (pid 7)'s main thread", "prog.py (pid 6)'s thread `poller`"."""
    pid, tid = key
    return f"{_who(trace, names, pid)}'s " + _thread_names(trace).get(key, _thread(pid, tid))


def _thread_names(trace):
    out = {}
    for e in trace.of_kind("thread.start"):
        out[(e.pid, e.tid)] = f"thread `{e.args.get('name')}`"
    return out


def _thread(pid, tid):
    return "main thread" if pid == tid else f"native thread {tid}"


# --- Python stacks, by thread -----------------------------------------------------------------

_LIBRARY = None
_HOOKS = os.path.dirname(os.path.abspath(__file__)) + os.sep    # mpviz/trace/: never the user's


def _library():
    global _LIBRARY
    if _LIBRARY is None:
        paths = sysconfig.get_paths()
        mpviz_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        _LIBRARY = tuple(os.path.realpath(paths[k]) for k in ("stdlib", "purelib", "platlib"))
        _LIBRARY += (mpviz_dir,)
    return _LIBRARY


def _stacks_by_thread(trace, pid, text):
    """``{tid: [(function, path, line), ...innermost first]}`` from faulthandler's `text`:
    a thread's block is named by its ident (``Thread 0x...``), which the recorded
    ``thread.start`` event ties to its OS thread id; the block not started by threading's
    ``_bootstrap`` is the main thread's (tid == pid)."""
    idents = {e.args.get("ident"): e.tid for e in trace.of_kind("thread.start") if e.pid == pid}
    out, calls, garbled, ident = {}, None, set(), None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(("Thread 0x", "Current thread 0x")):
            ident = int(line.split("0x", 1)[1].split()[0], 16)
            calls = out.setdefault(ident, [])
        elif line.startswith("File ") and calls is not None:
            try:
                path, rest = line[6:].split('", line ', 1)
                lineno, fn = rest.split(" in ", 1)
            except ValueError:
                continue
            # faulthandler writes "line ???" where it cannot tell the line (a frame mid-call)
            lineno = int(lineno) if lineno.isdigit() else None
            if garbled_frame(path, fn, lineno):
                garbled.add(ident)
                calls = None               # the rest of this thread's block is not its stack
            elif not os.path.realpath(path).startswith(_HOOKS):    # a recording hook's frame
                calls.append((fn.strip(), path, lineno))
                if fn.strip() == "_launch" and path.endswith("popen_fork.py"):
                    calls = None       # below the fork: the parent's frames, cut (own_frames),
                    #                    and not judged (3.14 writes '"__init__", line ???' there)
    by_tid = {}
    for ident, calls in out.items():
        calls = own_frames(calls)
        if ident in idents:
            by_tid[idents[ident]] = calls
        elif calls and ident not in garbled and not (
                calls[-1][0] == "_bootstrap" and calls[-1][1].endswith("threading.py")):
            by_tid[pid] = calls
    return by_tid


def garbled_frame(path, fn, lineno=None):
    """Is this a frame faulthandler read while its thread ran on (it reads frames without the
    GIL: a thread that spins can change them under it) -- "__loader__", line 257562111 in
    ???: no file of that name, no function, a line past the file's end? Its thread's stack
    ends there; and a block cut so cannot tell whether its thread is the main one."""
    if fn.strip() == "???" or not (path.startswith(("<", os.sep)) or os.path.isfile(path)):
        return True
    return isinstance(lineno, int) and os.path.isfile(path) and \
        not linecache.getline(path, lineno)


def own_frames(calls):
    """`calls` (innermost first) without the frames a forked child inherited: its stack goes on
    below the fork (``popen_fork.py``'s ``_launch``) into its parent's, down to the parent's
    line that started it -- not where the child is (``analysis.user_line`` cuts them too). A
    child forked by a Pool's helper thread would otherwise read as a thread, not a main one."""
    for i, (fn, path, _) in enumerate(calls):
        if fn == "_launch" and path.endswith("popen_fork.py"):
            return calls[:i]
    return calls


def _mine(path):
    return not path.startswith("<") and not os.path.realpath(path).startswith(_library())


def own_line(calls):
    """"task (prog.py:21): `log.info(...)`": the innermost call in the program's own code."""
    for fn, path, lineno in calls or ():
        if _mine(path):                          # (lineno None: faulthandler could not tell)
            return line_words(fn, path, lineno)
    return None


def _native_call(calls):
    """The library call the program's line made, when the innermost frame is not its own:
    "torch's `einsum` (torch/functional.py:402)"."""
    if not calls or _mine(calls[0][1]):
        return None
    fn, path, lineno = calls[0]
    parts = os.path.realpath(path).split(os.sep)
    package = next((parts[i + 1] for i, p in enumerate(parts)
                    if p == "site-packages" and i + 1 < len(parts)), None)
    where = os.sep.join(parts[-2:]) if package else os.path.basename(path)
    where += "" if lineno is None else f":{lineno}"
    return f"{package + chr(39) + 's ' if package else ''}`{fn}` ({where})"


# --- why one process can never move --------------------------------------------------------------

def _own_threads_why(trace, pid, names):
    """Why a process no fork made can never move: its threads wait for each other -- or for a
    thread of it that an exception ended (a producer thread that raised: the put its consumer
    waits for, the release or set another waits for, never comes)."""
    at = stuck_moment(trace) or (trace.events[-1].ts_ns if trace.events else 0)
    dead = _threads_that_raised(trace, pid, at)
    if dead:
        which = join_and([f"`{name}`" for name in dead])
        return ("{who}: every thread left waits, with no time limit, for something only a "
                f"thread of its own could do -- and {which} ended with an error (below): what "
                f"{'it' if len(dead) == 1 else 'they'} would have done next (a put, a get, a "
                f"task_done(), a release, a set) never comes; the stacks say where each "
                f"waits.")
    getters, unfed = _starved_thread_queues(trace, pid, at)
    copies = puts_into_their_own(trace, pid, at) if unfed and not getters else []
    if copies:
        n, who = sum(unfed.values()), join_and([_who(trace, names, q) for q in copies])
        return ("{who}: "
                f"{n} thread{'s wait' if n > 1 else ' waits'} in get() on "
                f"{join_and(sorted(unfed))}, which no thread of it has put into -- and {who} "
                f"put into a queue.Queue that no thread of {'it' if len(copies) == 1 else 'them'}"
                f" gets from: a queue.Queue lives in one process's memory, and a child process "
                f"has a queue.Queue of its own (fork copies it, spawn makes a new one): its "
                f"put() never reaches another process's queue. Fix: a multiprocessing Queue "
                f"(`multiprocessing.Queue()`, or your context's), " + PASSED_TO_IT)
    if unfed and not getters:
        n = sum(unfed.values())
        return ("{who}: "
                f"{n} thread{'s wait' if n > 1 else ' waits'} in get() on "
                f"{join_and(sorted(unfed))}, which no thread has put into yet -- and every "
                f"other thread of it waits too, with no time limit (below): nothing will ever "
                f"be put. Fix: put into it before waiting for the threads that get from it (a "
                f"join(), or the end of a `with ThreadPoolExecutor(...)` block, which waits "
                f"for its tasks), or give that get() a timeout.")
    if getters:
        queues = join_and(sorted(getters))
        n = sum(getters.values())
        return ("{who}: its threads wait for each other: "
                f"{n} thread{'s wait' if n > 1 else ' waits'} in get() on {queues}, with "
                f"nothing in it, and every thread that put into it waits too (for how long "
                f"and for what: below) -- nothing more will ever be put. A thread that loops "
                f"on `q.get()` never ends by itself. Fix: after the last item, put one "
                f"sentinel per worker thread (`q.put(None)`) and return from the worker when "
                f"it gets one; or make the workers daemon threads (`daemon=True`) and wait "
                f"with `q.join()` instead of joining them.")
    seen = any(e.kind.startswith("lock.") and is_thread_lock(e.args.get("lock"))
               for e in trace.events if e.pid == pid)
    return ("{who}: its threads wait for each other (a lock taken twice, a join of a "
            "thread that waits for the joiner, a lock held while waiting for a task "
            "that takes it, or a task waiting for a task queued behind it); the stacks "
            "say where." + ("" if seen else " Its threading locks were not recorded: "
                            "`python -m mpviz trace --threading-locks ...` (or "
                            "`record(threading_locks=True)`) records them, and then says "
                            "which lock each thread waits for and who holds it."))


# How a process gets the multiprocessing object a fix names: the same one, not a copy.
PASSED_TO_IT = "made before the Process is started and passed to it as an argument."


def _waits_at_exit_for(trace, pid, text, at):
    """The reason of a process whose main thread has run the program to its end and waits, in
    threading's _shutdown, for its threads not made daemon=True -- one of which never ends (a
    loop on q.get() nobody stops, a wait for an Event nobody sets). None when the main thread is
    elsewhere, or when a thread of it raised (_own_threads_why tells that story)."""
    if _threads_that_raised(trace, pid, at):
        return None
    calls = _stacks_by_thread(trace, pid, text).get(pid)
    if not calls or calls[-1][0] != "_shutdown" or not _in_threading(calls[-1][1]):
        return None
    alive = {}
    for e in trace.events:
        if e.pid != pid or e.ts_ns > at:
            continue
        if e.kind == "thread.start" and not e.args.get("daemon") and \
                not str(e.args.get("name")).startswith("mpviz"):
            alive[e.tid] = e.args.get("name")
        elif e.kind == "thread.exit":
            alive.pop(e.tid, None)
    if not alive:
        return None
    waits = {b.tid: b.what for b in state_at(trace, at).blocked if b.pid == pid}
    one = len(alive) == 1
    threading_wait = _threading_wait(trace, pid, text) if one else None   # (not recorded)
    if threading_wait and not waits:
        kind, call, line = threading_wait
        waits = {tid: f"a threading.{kind}'s {call}, at {line}" for tid in alive}
    said = [f"`{name}`" + (f" (it waits: {waits[tid]})" if tid in waits else "")
            for tid, name in alive.items()]
    if all(str(waits.get(tid, "")).startswith("get()") for tid in alive):
        why = ": a loop waiting for more work ends only when it is told to stop"
    else:
        why = "" if len(waits) == len(alive) else " (the stacks say where it waits)"
    it, them = ("it", "it a daemon thread") if one else ("each", "them daemon threads")
    return ("{who}: its main thread has run the program to its end and waits, at exit, for "
            f"the thread{'' if one else 's'} not made with daemon=True to end -- Python waits "
            f"for every such thread -- and {join_and(said)} never {'ends' if one else 'end'}"
            f"{why}. Fix: tell {it} to stop before the program ends (a sentinel, "
            f"`q.put(None)`, that its loop returns on; or an Event it checks) and join() "
            f"{'it' if one else 'them'}; or make {them} (`daemon=True`) if what "
            f"{'it has' if one else 'they have'} not done yet may be lost.")


def _threads_that_raised(trace, pid, at):
    """The names of the threads of process `pid` that an exception ended before `at` (the
    stuck moment: before the kill)."""
    return [name for p, tid, name, *_ in errors_before(trace, at) if p == pid and tid is not None]


def _starved_thread_queues(trace, pid, at):
    """({"queue.Queue 1": how many threads wait in its get()}, the same for queues nobody has
    put into) for the queue.Queues of process `pid` that threads wait on at `at` (a recorded
    get() still open, as ``state_at`` has it) while every thread that ever put into them waits
    too (any recorded wait, a lock's included). The names and putters are the index's."""
    ix, state = _index(trace), state_at(trace, at)
    waiting = {b.tid for b in state.blocked if b.pid == pid} | \
        {t for lk in state.locks for p, t, _ in lk.waiters if p == pid}
    out, unfed = {}, {}
    for b in state.blocked:
        if b.pid != pid or b.on != "thread_queue.get":
            continue
        putters = {t for p, t, _ in ix.putters.get(b.target, ()) if p == pid}
        if putters <= waiting:
            into = out if putters else unfed
            name = ix.tqueue_name(b.target)
            into[name] = into.get(name, 0) + 1
    return out, unfed


def _why(watchdog, stacks, names):
    """Why the processes that can never move cannot: a fork while threads ran, a fork after
    native threads, the native call their line made; then the fix (once, and only where a
    process was forked: a program's own threads that wait for each other are no fork's fault)."""
    trace, reasons, native_seen, forked = watchdog.trace, {}, False, False
    at = stuck_moment(trace) or (trace.events[-1].ts_ns if trace.events else 0)
    for pid in watchdog.stuck_pids:
        text = (stacks.get(pid) or {}).get("stacks", "")
        # (at exit first: what its threads wait on is why they never end, not the story)
        said = (_terminated_pool_wait(trace, pid, at) or _waits_at_exit_for(trace, pid, text, at)
                or _threading_reason(trace, pid, text, at))
        if said:
            reasons.setdefault(said, []).append(pid)
            continue
        start = next((e for e in trace.of_kind("process.start")
                      if e.pid == pid and e.args.get("how") == "fork"), None)
        if start is None:
            reasons.setdefault(_own_threads_why(trace, pid, names), []).append(pid)
            continue
        forked, ppid = True, start.args.get("ppid")
        parent = f"{names.get(ppid, '?')} (pid {ppid})"
        running = _python_threads_at(trace, ppid, start.ts_ns, pid)
        if running:
            which = " and ".join(f"`{n}`" for n in running)
            s = "s" if len(running) > 1 else ""
            reasons.setdefault(
                f"{{who}} {{was}} forked while thread{s} {which} {'were' if s else 'was'} "
                f"running in {parent}: a lock held at the fork is never released in the child "
                f"(fork copies the lock, held, but not the thread that would release it).",
                []).append(pid)
        native = watchdog.facts.native.get(ppid) or []
        if native:
            native_seen = True
            where = "; ".join(f"native thread {tid} {words}" for tid, words, _ in native[:4])
            reasons.setdefault(
                f"{{who}} {{was}} forked after native threads: {parent} runs {len(native)} "
                f"thread(s) Python did not start (a library's thread pool, such as torch's "
                f"OpenMP threads) -- {where}. fork copies none of them: what waits for them in "
                f"the child waits for ever.", []).append(pid)
            calls = _stacks_by_thread(trace, pid,
                                      (stacks.get(pid) or {}).get("stacks", "")).get(pid)
            call, view = _native_call(calls), watchdog.seen[(pid, pid)].view
            same = [tid for tid, _, addr in native
                    if view.call == "futex" and addr == view.args[:1]]
            if call:
                reasons.setdefault(
                    f"{{who}}: {own_line(calls) or 'its line'} called {call}, a native call "
                    f"that never returned: the main thread {watchdog.facts.words[(pid, pid)]}"
                    + (f", on the same futex address as the parent's native thread {same[0]} "
                       f"-- it waits for a thread it does not have" if same else "") + ".",
                    []).append(pid)
        if not running and not native:
            reasons.setdefault(
                f"{{who}} {{was}} forked by {parent}; a lock it waits for was copied held, or "
                f"its threads wait for each other; the stacks say where.", []).append(pid)
    lines = []
    for text, pids in reasons.items():
        who = join_and([names.get(p, str(p)) for p in pids])
        lines.append("  " + text.format(who=who, was="were" if len(pids) > 1 else "was",
                                        waits="wait" if len(pids) > 1 else "waits"))
    if lines and forked:
        lines.append(f"  Fix: {FORK_FIX}" + (f"; {NATIVE_FIX}." if native_seen else "."))
    return lines


def _terminated_pool_wait(trace, pid, at):
    """The reason of a process whose thread waits for the result of a Pool job that its Pool
    dropped unfinished when it was terminated (analysis.terminated_job); None if none does.
    Said before: "its threads wait for each other (a lock taken twice, ...)" -- none of which
    the program did."""
    for b in state_at(trace, at).blocked:
        if b.pid == pid and b.on == "pool.result":
            dropped = terminated_job(trace, b.target, at, pid)
            if dropped:
                what, why, fix = (part.replace("{", "{{").replace("}", "}}") for part in dropped)
                return (f"{{who}} {{waits}} for the result of {what}, which will never come: "
                        f"{why}. Fix: {fix}.")
    return None


def _threading_reason(trace, pid, text, at):
    """The reason of a process whose thread waits on a threading Event, Semaphore, Condition or
    Barrier (its stacks `text`): a child's is its own copy; the program's own process's has
    nobody left to wake it. None when no thread waits so, or when one of its threads raised
    (the one that would have set or notified: _own_threads_why tells that story)."""
    waits = _threading_wait(trace, pid, text)
    if not waits or _threads_that_raised(trace, pid, at):
        return None
    kind, call, line = waits
    verb, theirs, does, nobody, make = _WAKES[kind]
    if any(e.pid == pid and e.args.get("how") in ("fork", "spawn", "forkserver")
           for e in trace.of_kind("process.start")):
        return (f"{{who}} {{waits}} in a threading.{kind}'s {call} ({line}): a "
                f"threading.{kind} lives in one process's memory -- each process has a copy "
                f"of its own (fork copies it, spawn makes a new one), which only a thread of "
                f"that process can {verb}; a {theirs} in another process {does} that "
                f"process's own. Fix: a multiprocessing {kind} (`multiprocessing.{make}`, or "
                f"your context's), " + PASSED_TO_IT)
    return (f"{{who}} waits in a threading.{kind}'s {call} ({line}), which only a thread of "
            f"{{who}} can {verb} -- and every thread of {{who}} waits (the stacks say where): "
            f"nobody is left to {nobody}.")


# What ends a wait on each threading object: (the verb, the call that does it, "it ...s",
# "nobody is left to ...", the multiprocessing object to make instead).
_WAKES = {"Event": ("set", "set()", "sets", "set it", "Event()"),
          "Semaphore": ("release", "release()", "releases", "release it", "Semaphore()"),
          "Condition": ("notify", "notify()", "notifies", "notify it", "Condition()"),
          "Barrier": ("arrive at", "wait()", "arrives at", "arrive", "Barrier(parties)")}

# The threading.py frames (innermost first) under the program's call, and what it called.
_THREADING_CALLS = {("wait",): ("Condition", "wait()"), ("wait", "wait"): ("Event", "wait()"),
                    ("wait", "acquire"): ("Semaphore", "acquire()"),
                    ("wait", "wait_for"): ("Condition", "wait_for()"),
                    ("wait", "wait_for", "_wait", "wait"): ("Barrier", "wait()"),
                    ("wait", "wait_for", "_enter", "wait"): ("Barrier", "wait()")}


def _threading_wait(trace, pid, text):
    """``(kind, its call, the program's line)`` where a thread of `pid` waits on a threading
    Event, Semaphore (or BoundedSemaphore), Condition or Barrier -- read off its stack: the
    frames in threading.py under the program's own (_THREADING_CALLS) -- or None.
    ("Event", "wait()", "work (prog.py:12): `start.wait()`")."""
    for calls in _stacks_by_thread(trace, pid, text).values():
        inner = 0
        while inner < len(calls) and _in_threading(calls[inner][1]):
            inner += 1
        what = _THREADING_CALLS.get(tuple(fn for fn, _, _ in calls[:inner]))
        if what and inner < len(calls) and _mine(calls[inner][1]):
            return what + (own_line(calls[inner:]),)
    return None


def _in_threading(path):
    return os.path.basename(path) == "threading.py"


def _python_threads_at(trace, pid, ts_ns, child):
    """Names of the threads Python started in `pid` that were running at `ts_ns` (the fork of
    `child`), but the one that forked it and mpviz's own."""
    forker = next((e.tid for e in trace.of_kind("process.launch")
                   if e.pid == pid and e.args.get("child") == child), None)
    alive = {}
    for e in trace.events:
        if e.ts_ns > ts_ns:
            break
        if e.pid == pid and e.kind == "thread.start":
            alive[e.tid] = e.args.get("name")
        elif e.pid == pid and e.kind == "thread.exit":
            alive.pop(e.tid, None)
    return [n for tid, n in alive.items() if tid != forker and not str(n).startswith("mpviz")]


def _native_threads(trace, pid):
    """``ThreadView``s of `pid`'s threads that Python did not start (no ``thread.start``
    recorded, not its main thread) and that recorded nothing: native threads."""
    python = {e.tid for e in trace.events if e.pid == pid}
    return [v for v in osview.threads(pid) if v.tid != pid and v.tid not in python]


# --- chains: a DataLoader waits for its workers ----------------------------------------------------

def _dataloader_chains(watchdog, stacks, names):
    """"main waits for a batch from worker 0 -- worker 0 has been in `time.sleep` for N s"."""
    trace, lines = watchdog.trace, []
    workers = {e.pid: e.args.get("worker_id") for e in trace.of_kind("dataloader.worker")
               if e.args.get("phase") == "start"}
    for pid in {s.view.pid for s in watchdog.seen.values()}:
        calls = _stacks_by_thread(trace, pid, (stacks.get(pid) or {}).get("stacks", "")).get(pid)
        if not calls or not any(fn in ("_get_data", "_next_data") and
                                path.endswith("dataloader.py") for fn, path, _ in calls):
            continue
        for wpid, wid in sorted(workers.items(), key=lambda kv: kv[1] or 0):
            s, waited = watchdog.seen.get((wpid, wpid)), watchdog.facts.waited.get((wpid, wpid))
            if s is None or s.view.wait == "running" or waited <= watchdog.hang_after:
                continue
            wcalls = _stacks_by_thread(trace, wpid,
                                       (stacks.get(wpid) or {}).get("stacks", "")).get(wpid)
            doing = watchdog.facts.words[(wpid, wpid)].replace(" (a deadline)", "")
            own = own_line(wcalls)
            lines.append(f"  {names.get(pid, pid)}'s main thread waits for a batch from worker "
                         f"{wid} -- worker {wid} has been {_has_been(doing)} for "
                         f"{waited:.1f} s" + (f", at {own}" if own else ""))
    if lines:
        lines.insert(0, "Who waits for whom (the DataLoader):")
        lines.append("  Fix: find why that line never returns; DataLoader(..., timeout=S) "
                     "makes the main process raise instead of waiting for ever.")
    return lines


def _has_been(doing):
    return doing if doing.startswith("in ") else "waiting: " + doing
