"""A trace: the merged events of every recorded process, and what can be read off them.

``record()`` starts this process's log and the hooks, yields a live ``Trace`` (call ``refresh()``
to pull in what the processes wrote since -- a widget can do that many times a second), and on
exit stops recording and reads everything. ``load(path)`` reads a directory afterwards, also one
left by processes that were killed. All the analyses are plain loops over ``events``, which are
sorted by ``ts_ns`` (one clock for all processes, see recorder.py)::

    processes()  process.start/bootstrap/exit + the parent's process.launch/reaped
    flows()      queue.put→queue.get and pipe.send→pipe.recv, paired by their message id (a
                 Queue's reads get theirs from the order of its writes: see messages.py)
    segments()   shm.create/attach/detach/unlink, by segment name
    locks()      lock.wait/acquire/release, paired per lock and thread into holds

An event's tour starts and ends here: ``mark()`` (at the end) hands it to recorder.py's Writer;
reader.py reads it back; ``Trace.refresh`` merges it in. ``plot()`` draws it with mpviz.viz,
imported by name (``DRAWING``) only then: the recorder's one import of the layer above.
"""
import bisect
import contextlib
import gc
import importlib
import os
import sys
from itertools import compress
from operator import itemgetter

from .. import _tempdirs
from . import messages, recorder
from .events import Event, Flow, Hold, LockInfo, ProcessInfo, Segment
from .events import order as _order
from .reader import LogReader

_install_depth = 0
_PID, _TS, _KIND, _PID_TID = itemgetter(1), itemgetter(0), itemgetter(3), itemgetter(1, 2)
_PROCESS_KINDS = frozenset(("process.start", "process.bootstrap", "process.exit",
                            "process.launch", "process.reaped"))


class Trace:
    """The events of one recording, ordered by time, and views computed from them."""

    def __init__(self, path=None, events=()):
        self.path = os.fspath(path) if path is not None else None
        self.events = sorted((Event(*e) for e in events), key=_order)
        self._links = messages.OrderLinks()       # Queue reads paired with writes, kept current
        self._links.add(self.events)
        self._reader = LogReader(self.path) if self.path is not None else None
        self._problems = []
        self._notes = []        # notes.txt's lines, kept when the directory goes (_detach)
        self.last_read = []     # the events the last refresh() read (the hang watchdog's)
        self.verdict = None     # a hang's verdict in words: record(hang_after=...), or load()
                                # of a directory where `mpviz trace` found a hang
        self.lost_work = []     # what a run that ended well lost without a word, in lines:
                                # record()'s end (analysis.lost_work), or load()'s, kept by
                                # `mpviz trace`

    def snapshot(self):
        """A copy of the events as they are now, to draw in another thread while this trace is
        refreshed (``refresh()`` re-sorts ``events`` in place), with this trace's notes and
        verdict. The events are linked already: the copy shares them and links nothing again
        (a new Trace would, all of them)."""
        copy = Trace()
        copy.events = list(self.events)
        copy._notes, copy.verdict = self._file_notes(), self.verdict
        copy.lost_work = list(self.lost_work)
        return copy

    def subset(self, keep):
        """A Trace of the events for which ``keep(event)`` is true, with this trace's notes and
        verdict (the timeline draws its first 40 lanes from one). As in ``snapshot``, the events
        are shared and linked already: nothing is linked again."""
        part = Trace()
        part.events = [e for e in self.events if keep(e)]
        part._notes, part.verdict = self._file_notes(), self.verdict
        part.lost_work = list(self.lost_work)
        return part

    @property
    def problems(self):
        """What could not be read (torn records, unreadable files), in words."""
        return list(self._reader.problems if self._reader else self._problems)

    @property
    def notes(self):
        """What could not be recorded, in words (``[]``: nothing known to be missing).

        Two sources: lines a process left in ``notes.txt`` beside the logs when its own log
        failed (the program closed or replaced the log's fd, the disk was full: recorder.py's
        ``note``), and events that say something is missing (a torch version mpviz cannot see
        inside, a torch hook that failed, an event too large to record)."""
        lines = self._file_notes() + _event_notes(self.events)
        return list(dict.fromkeys(lines))                  # each once, in order

    def _file_notes(self):
        return recorder.read_notes(self.path) if self.path is not None else list(self._notes)

    def _detach(self):
        """Stop reading (the directory is about to go away); keep the events."""
        if self._reader is not None:
            self._problems = list(self._reader.problems)
        if self.path is not None:
            self._notes = recorder.read_notes(self.path)
        self.path, self._reader = None, None

    def refresh(self, final=False):
        """Read what the processes wrote since the last refresh; return how many new events."""
        if self._reader is None:
            return 0
        with without_gc():
            new = self.last_read = [Event(*e) for e in self._reader.poll(final=final)]
        if new:
            new.sort(key=_order)
            if self.events and _order(new[0]) < _order(self.events[-1]):
                # Only the tail from where the earliest new event belongs is sorted again:
                # the hang watchdog refreshes ten times a second, and sorting all of it each
                # time made 5.9 million sort-key calls in a 240,000-event run.
                at = bisect.bisect_right(self.events, _order(new[0]), key=_order)
                tail = self.events[at:]
                tail.extend(new)
                tail.sort(key=_order)     # timsort: two sorted runs merge in linear time
                self.events[at:] = tail
            else:
                self.events.extend(new)
            self._links.add(new)                  # a read may now find its write
        return len(new)

    def __len__(self):
        return len(self.events)

    def __iter__(self):
        return iter(self.events)

    def __repr__(self):
        return (f"<Trace {len(self.events)} events, {len(self.processes())} processes"
                f"{', from ' + repr(self.path) if self.path else ''}>")

    def of_kind(self, *kinds):
        """The events whose kind is one of `kinds` (or starts with one ending in '.')."""
        prefixes = tuple(k for k in kinds if k.endswith("."))
        if not prefixes:                      # (a pass over every event: kept to one test each)
            return [e for e in self.events if e.kind in kinds]
        return [e for e in self.events if e.kind in kinds or e.kind.startswith(prefixes)]

    # --- views ---------------------------------------------------------------------------

    def processes(self):
        """One ``ProcessInfo`` per process seen (recorded, launched or reaped), by start time."""
        info = {}

        def get(pid, ts):
            if pid not in info:
                info[pid] = dict(pid=pid, ppid=None, name=None, how=None, start_ns=ts,
                                 exit_ns=None, exitcode=None, signal=None, threads=[])
            return info[pid]

        # Three facts of every event are taken in C-speed passes (a Python loop over every
        # event took 0.3 s for a 290,000-event DataLoader trace, and the launcher asks twice):
        # each process's last event, its threads in the order they first recorded, and where
        # each process first recorded. The loop below then visits only those first events and
        # the process.* events -- the same steps, in the same order, as one loop over all.
        events = self.events
        pids = list(map(_PID, events))
        last = dict(zip(pids, map(_TS, events)))                  # pid -> its last own event
        threads = {}                                              # pid -> its tids, in order
        for pid, tid in dict.fromkeys(map(_PID_TID, events)):
            threads.setdefault(pid, []).append(tid)
        firsts = dict(zip(reversed(pids), range(len(pids) - 1, -1, -1)))  # pid -> first index
        visit = sorted(set(firsts.values()).union(
            compress(range(len(events)), map(_PROCESS_KINDS.__contains__, map(_KIND, events)))))
        killed = {}                                               # the reap of a killed one
        for e in map(events.__getitem__, visit):
            p = get(e.pid, e.ts_ns)
            a = e.args
            if e.kind == "process.start":
                if a.get("how") == "watchdog" and p["how"] not in (None, "launcher"):
                    continue    # record(hang_after=S)'s watchdog log, in the recording process:
                                # that process is still the program's (the launcher's is mpviz's)
                p.update(ppid=a.get("ppid"), how=a.get("how"), start_ns=min(p["start_ns"], e.ts_ns))
                p["name"] = p["name"] or a.get("name")
            elif e.kind == "process.bootstrap":
                p["name"] = a.get("name")
            elif e.kind == "process.exit":
                p["exit_ns"] = e.ts_ns
                if a.get("exitcode") is not None:
                    p["exitcode"] = a["exitcode"]
            elif e.kind == "process.launch":
                c = get(a["child"], e.ts_ns)
                c["ppid"] = c["ppid"] or e.pid
                c["name"] = c["name"] or a.get("name")
                c["how"] = c["how"] or a.get("start_method")
            elif e.kind == "process.reaped":
                c = get(a["child"], e.ts_ns)
                c["exitcode"], c["signal"] = a.get("exitcode"), a.get("signal")
                if c["exit_ns"] is None:
                    c["exit_ns"] = e.ts_ns
                if a.get("signal"):
                    killed.setdefault(a["child"], e.ts_ns)   # (the first: the watchdog's)
        # A process's recorded exit is not always its end: a traced program records its exit in
        # an atexit function, and more can run after it (a hang at exit, killed seconds later).
        # It lived until its last event, and one killed by a signal until it was killed.
        for pid, p in info.items():
            if p["exit_ns"] is not None:
                p["exit_ns"] = max(p["exit_ns"], last.get(pid, 0), killed.get(pid, 0))
        out = [ProcessInfo(**{**p, "threads": tuple(threads.get(pid, ()))})
               for pid, p in info.items()]
        return sorted(out, key=lambda p: p.start_ns)

    def flows(self):
        """Every message from its put/send to its get/recv, in the order they were put (not a
        put that raised: ``queue.put_failed``)."""
        puts, gets, sizes = {}, {}, {}
        for e in self.events:
            if e.kind in ("queue.put", "pipe.send"):
                puts[e.args["msg"]] = e
            elif e.kind in ("queue.get", "pipe.recv"):
                gets.setdefault(e.args["msg"], e)
            elif e.kind == "queue.feed":
                sizes[e.args["msg"]] = e.args.get("nbytes")
            elif e.kind == "queue.put_failed":
                puts.pop(e.args["msg"], None)   # (it comes after its put, in time order)
        for msg, put in puts.items():             # a Queue learns the size in its feeder
            if put.args.get("nbytes") is None and msg in sizes:
                put.args["nbytes"] = sizes[msg]
        return [Flow(put, gets.get(msg)) for msg, put in puts.items()]

    def segments(self):
        """Every shared-memory segment seen: creator, attachers, detachers, unlink."""
        done, live = [], {}
        for e in self.events:
            if not e.kind.startswith("shm."):
                continue
            name, a = e.args.get("name"), e.args
            s = live.get(name)
            if s is None or (e.kind == "shm.create" and s["unlinked_ns"] is not None):
                if s is not None:
                    done.append(s)
                s = live[name] = dict(name=name, strategy=a.get("strategy"),
                                      nbytes=a.get("nbytes"), created_by=None, created_ns=None,
                                      attached_by=[], unlinked_ns=None, unlinked_by=None,
                                      detached_by=[])
            s["strategy"] = s["strategy"] or a.get("strategy")
            s["nbytes"] = s["nbytes"] if s["nbytes"] is not None else a.get("nbytes")
            if e.kind == "shm.create":
                s["created_by"], s["created_ns"] = e.pid, e.ts_ns
            elif e.kind == "shm.attach" and e.pid not in s["attached_by"]:
                s["attached_by"].append(e.pid)
            elif e.kind == "shm.detach":
                s["detached_by"].append(e.pid)
            elif e.kind == "shm.unlink":
                s["unlinked_ns"], s["unlinked_by"] = e.ts_ns, e.pid
        done.extend(live.values())
        return [Segment(**{**s, "attached_by": tuple(s["attached_by"]),
                           "detached_by": tuple(s["detached_by"])}) for s in done]

    def locks(self):
        """Every lock's holds (who, waited since, acquired, released) and its waiters at the end."""
        state = {}
        for e in self.events:
            if not e.kind.startswith("lock."):
                continue
            lid, who = e.args["lock"], (e.pid, e.tid)
            st = state.setdefault(lid, dict(type=e.args.get("type"), holds=[], open=[], waits={}))
            if e.kind == "lock.wait":
                st["waits"][who] = e.ts_ns
            elif e.kind == "lock.timeout":
                st["waits"].pop(who, None)
            elif e.kind == "lock.acquire":
                hold = [e.pid, e.tid, st["waits"].pop(who, None), e.ts_ns, None]
                st["holds"].append(hold)
                st["open"].append(hold)
            elif e.kind == "lock.release" and st["open"]:
                mine = [h for h in st["open"] if (h[0], h[1]) == who]
                hold = mine[-1] if mine else st["open"][0]  # a semaphore: anyone may release
                hold[4] = e.ts_ns
                st["open"].remove(hold)
        return [LockInfo(lid, st["type"], tuple(Hold(*h) for h in st["holds"]),
                         tuple((pid, tid, ts) for (pid, tid), ts in st["waits"].items()))
                for lid, st in state.items()]

    # --- output ----------------------------------------------------------------------------

    def to_chrome(self, path=None):
        """Chrome/Perfetto trace JSON (a dict); also written to `path` if given."""
        from .chrome import to_chrome
        with without_gc():                    # (hundreds of thousands of small dicts)
            return to_chrome(self, path)

    def plot(self, **kwargs):
        """Draw the timeline (needs matplotlib): ``drawing().timeline(self)``."""
        return drawing().timeline(self, **kwargs)


# Pictures are mpviz.viz's: it draws Traces, and imports matplotlib. Layers point one way (viz
# imports the recorder: tests/test_module_knots.py), with this one exception, named there
# (UP_BY_NAME): ``Trace.plot()`` and the pictures of `mpviz trace` (launcher.py) import it by
# this name, only when a picture is asked -- never at import, nor while recording.
DRAWING = "mpviz.viz"


def drawing():
    """The package that draws (``DRAWING``), imported now; ImportError without matplotlib."""
    return importlib.import_module(DRAWING)


UNKNOWN = "unknown, not zero"   # in every note whose part of the run is missing (viz.summary)


@contextlib.contextmanager
def without_gc():
    """Python's cyclic garbage collector off for the block (and back on after, if it was on).

    Reading a trace makes hundreds of thousands of small tuples and dicts, none in a cycle;
    each 700 of them start a collection, and every so often one that walks every object alive
    -- the whole trace read so far, again and again. Off while reading, a 240,000-event trace
    loads in 1.0 s of CPU instead of 1.4, and trace.json is written in 2.4 s instead of 2.9."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _event_notes(events):
    """The events that say what was not recorded, as lines (dropped events counted, not listed)."""
    blind, dropped = {}, {}     # torch's reason -> the pids it holds for; (pid, kind) -> count
    unhooked = {}               # (what, why, fix) -> pids: a framework mpviz does not hook
    for e in events:
        if e.kind in ("torch.unsupported", "torch.hook_failed"):
            blind.setdefault(e.args.get("reason"), []).append(e.pid)
        elif e.kind == "not_recorded":
            key = (e.args.get("what"), e.args.get("why"), e.args.get("fix"))
            unhooked.setdefault(key, []).append(e.pid)
        elif e.kind == "record.dropped":
            key = (e.pid, e.args.get("kind"))
            dropped[key] = (dropped.get(key, (0, None))[0] + 1, e.args.get("error"))
    # One line per reason, whatever the number of processes (a program that forks a thousand
    # children under an unsupported torch gets one line, not a thousand).
    lines = [f"{_pids_in_words(pids)}: torch's shared memory is NOT recorded: {reason}; its "
             f"segments, copies and handles are {UNKNOWN}"
             for reason, pids in blind.items()]
    lines += [f"{_pids_in_words(pids)}: {what}: {why}. Fix: {fix}"
              for (what, why, fix), pids in unhooked.items()]
    for (pid, kind), (n, error) in dropped.items():
        lines.append(f"pid {pid}: {n} {kind!r} event{'s' * (n > 1)} not recorded ({error})")
    return lines


def _pids_in_words(pids, most=5):
    """"pid 7", "pids 7, 9", "1000 processes (pids 7, 9, 11, 13, 15, ...)" (also the launcher's
    words for many processes whose end was not recorded)."""
    pids = list(dict.fromkeys(pids))
    if len(pids) == 1:
        return f"pid {pids[0]}"
    if len(pids) <= most:
        return "pids " + ", ".join(map(str, pids))
    return f"{len(pids)} processes (pids {', '.join(map(str, pids[:most]))}, ...)"


VERDICT_FILE = "verdict.txt"    # a hang's verdict, beside the logs: the launcher writes it
LOST_WORK_FILE = "lost_work.txt"  # analysis.lost_work's lines, one a line: the launcher's too


def load(path):
    """Read a trace directory (also one whose processes were killed) into a ``Trace``.

    A missing directory raises ``FileNotFoundError``; unreadable parts are skipped with a
    ``TraceFormatWarning`` that says what was skipped (``trace.problems`` lists them).
    A list of directories, one per host of a torch.distributed job, is merged into one trace,
    the hosts' clocks aligned at the rendezvous (merge.py says how, ``notes`` how well).
    """
    if isinstance(path, (list, tuple)):
        from .merge import merge          # (merge imports this module: Trace, and load)
        return merge(path)
    trace = Trace(path)
    trace.refresh(final=True)
    try:              # a hang's verdict, kept by ``python -m mpviz trace`` (launcher.py)
        with open(os.path.join(trace.path, VERDICT_FILE)) as f:
            trace.verdict = f.read()
    except OSError:
        pass
    try:              # what its good end lost, kept by ``python -m mpviz trace`` too
        with open(os.path.join(trace.path, LOST_WORK_FILE)) as f:
            trace.lost_work = [line for line in f.read().splitlines() if line]
    except OSError:
        pass
    return trace


@contextlib.contextmanager
def record(path=None, *, threading_locks=False, hang_after=None):
    """Record this process and every process started inside the block.

    `path`: the trace directory (created if missing, kept afterwards); None records into a
    temporary directory that is removed at the end (the events stay in the returned trace).
    `threading_locks`: also record ``threading.Lock``/``RLock`` made by your code.
    `hang_after`: seconds (at least watchdog.MIN_HANG_AFTER); when a process can never move,
    or no thread moves for that long (watchdog.py says how each thread is judged), the
    hang watchdog captures every process's Python stacks, prints a verdict, kills
    the processes started in the block, interrupts the block if it still waits, and ``record``
    raises ``HangError`` (the trace keeps the events: draw it with ``mpviz.viz.plot(trace)``).
    None or 0: no watchdog, as ``python -m mpviz trace --hang-after 0``.
    Ctrl-C (a cell's interrupt) in the block, in the main thread: the same report as a hang's --
    each process's stacks, what each waits for, who must act -- then the processes started in
    the block are ended, their shared memory removed, and the KeyboardInterrupt goes on.
    If recording cannot start, a ``RecorderWarning`` says why and the block runs unrecorded.
    """
    global _install_depth
    if hang_after is not None:
        from .watchdog import check_hang_after
        hang_after = check_hang_after(hang_after)
    temporary = path is None
    directory = _tempdirs.make("mpviz-trace-") if temporary else os.fspath(path)
    from . import hooks      # (here: reading a trace, as `mpviz trace` does, patches nothing)
    previous = recorder.current_directory()
    trace = Trace(directory)
    ok = recorder.start(directory, "record")
    if not ok:
        trace._detach()
    else:
        hooks.install(threading_locks=threading_locks)
        hooks.say_missing(directory)
        _install_depth += 1
        from . import torch_hooks   # real torch's sharing, now or once torch is imported
        torch_hooks.watch()
    guard, ended_well = None, False
    try:
        if ok:        # (no hang_after: no watchdog, but the stacks and the Ctrl-C report)
            from .watchdog import Guard
            guard = Guard(directory, hang_after)
        yield trace
        ended_well = True
    except KeyboardInterrupt as exc:
        if guard is not None and guard.interrupted is not None:
            guard.hide_handler(exc)
            guard.clean_up()                  # Ctrl-C: reported; the block's processes end
            trace.verdict = guard.interrupted
        raise
    finally:
        if guard is not None:
            guard.stop()
        if ok:
            recorder.stop()
            _install_depth -= 1
            if _install_depth == 0:
                hooks.uninstall()
            trace.refresh(final=True)
            if ended_well and (guard is None or guard.verdict is None):
                _say_lost_work(trace)
        if previous is not None:
            recorder.start(previous, "resume")
        if temporary:
            trace._detach()
            _tempdirs.remove(directory)
        if guard is not None and guard.verdict is not None:
            from .watchdog import HangError
            trace.verdict = guard.verdict
            raise HangError(guard.verdict, None if temporary else directory)


def _say_lost_work(trace):
    """At the end of a ``record()`` block that ended well: what it lost without a word (a
    message its Queue's feeder could not pickle, a Pool task's error nobody asked for, a model
    forked without share_memory()), printed under the cell, as ``mpviz trace`` prints it at a
    program's end, and kept as ``trace.lost_work``."""
    try:
        from .analysis import lost_work
        trace.lost_work = lost_work(trace, "the recorded block ended without an error")
    except Exception as exc:        # (never the block's end: the trace is complete)
        trace.lost_work = []
        print(f"mpviz.trace.record: could not look for lost work ({exc!r}); the trace is "
              f"complete", file=sys.stderr)
        return
    for line in trace.lost_work:
        print(f"mpviz.trace.record: {line}", file=sys.stderr)


def mark(name, **args):
    """Record a user event named `name` with JSON-able `args` (nothing when not recording)."""
    writer = recorder.writer      # straight to the Writer: one call less than recorder.emit
    if writer is not None:
        writer.mark(name, args)
