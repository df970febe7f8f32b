"""Distributed hangs and failures in words (torch.distributed or mpviz.distributed, as recorded):

Every rank records its rendezvous and each collective it calls, numbered per group
(``dist.rendezvous``, ``dist.collective``: dist_hooks.py for torch, mpviz.distributed for ours).
A collective completes only when every rank of its group has called it, and ranks match their
calls by their order (the seq), not by name. So the trace answers, rank by rank::

    at collective #3:  rank 0 all_reduce (waits)   rank 1 barrier (waits)  -> they DISAGREE
                       rank 0 all_reduce (waits)   rank 1 ended, code 1    -> never completes
                       rank 0 all_reduce (waits)   rank 1 in time.sleep    -> rank 1 is SLOW
    rendezvous:        ranks 0, 1 began, world_size 3  -> "waiting for 3 ranks ...; 2 arrived"
    DDP:               rank 0 in backward() (by its stack), rank 1 in barrier #3 or gone
                                               -> its gradient all-reduce is never joined
    at all_gather #1:  rank 1 killed by SIGABRT in it  -> the backend ended it (sizes differ)
    at all_reduce #5:  rank 0 16 bytes, rank 1 4 bytes  -> they DISAGREE in size (gloo may
                       complete it on one rank with a wrong result: no call is missing)

A send and a recv are no collective: the n-th send from rank 0 to rank 1 meets rank 1's n-th
recv from rank 0 (``seq`` counts that pair's messages), whatever else the group does. So a
point-to-point call's ``group`` here is its pair, (sender, receiver), and it never disagrees.

The gloo backend waits in C++ threads, some with timeouts: by /proc alone such a program looks
STALLED (a deadline) or busy. These events come first: the watchdog asks ``judge`` when it has
found a hang, and the launcher asks it when a program that used torch.distributed failed.
Each verdict says what the events show, then the fix; where each thread is follows (stuck.py).
"""
import os
import re
from typing import NamedTuple, Optional

from .dist_hooks import DDP_NOTE

DDP_FIX = ("  A DDP rank in backward() all-reduces its gradients with every other rank: a rank "
           "that ran out of batches (uneven inputs) and went on never joins it. Fix: give every "
           "rank the same number of batches (DistributedSampler pads the shards to equal "
           "length), or train inside `with model.join():` (DDP's own answer to uneven inputs).")
ORDER_FIX = ("every rank of a group must call the same collectives in the same order: a "
             "collective inside `if rank == ...:`, or a loop whose length differs between ranks "
             "(shards of different sizes), breaks that")


class Call(NamedTuple):
    """One rank's call of one collective (begin to end; end_ns None: it was still in it)."""
    pid: int
    rank: int
    group: tuple
    seq: int
    op: str
    begin_ns: int
    end_ns: Optional[int]
    error: Optional[str]
    async_op: bool
    p2p: bool = False       # a send or recv: `group` is (sender, receiver), `seq` their n-th
    nbytes: Optional[int] = None    # the bytes of the tensor(s) this rank put in


P2P = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}
# the collectives whose tensor (``nbytes``) must be the same size on every rank of the group
# (not all_gather, gather, reduce_scatter: torch allows them uneven tensors, on NCCL)
SAME_SIZE = {"all_reduce", "broadcast", "reduce", "all_gather_into_tensor",
             "reduce_scatter_tensor"}


def _pair(a):
    """A point-to-point call's (sender, receiver); (receiver,) for a recv from anyone."""
    rank, peer = a.get("rank"), a.get("peer")
    if P2P[a.get("op")] == "send":
        return (rank, peer)
    return (peer, rank) if peer is not None else (rank,)


class Ranks:
    """The torch.distributed events of a trace, read once (up to `until_ns`, if given)."""

    def __init__(self, trace, until_ns=None):
        self.rank_of, self.world, self.backend = {}, {}, {}   # pid -> rank, world_size, backend
        self.library = "torch.distributed"   # or "mpviz.distributed", as its rendezvous says
        self.arrived, self.left = {}, {}     # pid -> rendezvous begin / end event
        self.calls, self.destroyed, self.raised, self.raised_ns = [], {}, {}, {}
        self.in_backward = set()             # pids whose exception came out of backward()
        open_, self.last_ns = {}, None
        for e in trace.of_kind("dist.", "spawn.raised"):
            if until_ns is not None and e.ts_ns > until_ns:
                break
            a, self.last_ns = e.args, e.ts_ns
            if e.kind == "dist.rendezvous":
                self.library = a.get("library") or self.library
                if a.get("rank") is not None and a.get("rank") >= 0:
                    self.rank_of[e.pid] = a["rank"]
                if a.get("world_size") is not None and a["world_size"] > 0:
                    self.world[e.pid] = a["world_size"]
                (self.arrived if a.get("phase") == "begin" else self.left)[e.pid] = e
            elif e.kind == "dist.collective":
                key = (e.pid, tuple(a.get("group") or ()), a.get("seq"), a.get("op"))
                if a.get("phase") == "begin":
                    p2p = a.get("op") in P2P
                    open_[key] = len(self.calls)
                    self.calls.append(Call(e.pid, a.get("rank"), _pair(a) if p2p else key[1],
                                           a.get("seq"), a.get("op"), e.ts_ns, None, None,
                                           bool(a.get("async_op")), p2p, a.get("nbytes")))
                elif key in open_:
                    i = open_.pop(key)
                    self.calls[i] = self.calls[i]._replace(end_ns=e.ts_ns, error=a.get("error"))
            elif e.kind == "dist.destroy":
                self.destroyed[e.pid] = e.ts_ns
            elif e.kind == "spawn.raised":
                self.raised[e.pid] = a.get("error")
                self.raised_ns[e.pid] = e.ts_ns
                if a.get("in_backward"):
                    self.in_backward.add(e.pid)
        self.pid_of = {rank: pid for pid, rank in self.rank_of.items()}

    def __bool__(self):
        return bool(self.arrived or self.calls)


def judge(trace, watchdog=None, stacks=None, until_ns=None):
    """The distributed verdict, or None when the trace has no torch.distributed in it.

    `watchdog`: the hang watchdog that fired (its /proc view says whether a rank that never
    came sleeps, works or waits); None: the program has ended. Returns a ``Verdict``."""
    ranks = Ranks(trace, until_ns)
    if not ranks:
        return None
    v = Verdict(trace, ranks, watchdog, stacks)
    (v.rendezvous() or v.disagree() or v.missing() or v.raised_in_backward() or
     v.sizes_differ() or v.after_destroy() or v.each_end())
    return v if v.sentence else None


def rendezvous_stalled(trace, hang_after, moving=()):
    """Seconds for which ranks have waited in init_process_group for ranks that never came,
    with no torch.distributed event since, if more than `hang_after`; else 0. `moving`: the
    pids whose threads moved lately (the watchdog's view): one of them that is not waiting
    there works -- a rank that builds its dataset before it joins is late, not missing."""
    import time
    ranks, now = Ranks(trace), time.monotonic_ns()
    waiting = [pid for pid in ranks.arrived if pid not in ranks.left]
    world = max(ranks.world.values(), default=0)
    if not waiting or len(ranks.arrived) >= world or set(moving) - set(waiting):
        return 0
    quiet = (now - ranks.last_ns) / 1e9
    return quiet if quiet > hang_after else 0


class Verdict:
    """``kind`` ("deadlock", "stalled" or "failed"), ``sentence`` (the headline's), ``lines``."""

    def __init__(self, trace, ranks, watchdog, stacks):
        from .watchdog import labels
        self.trace, self.r, self.watchdog, self.stacks = trace, ranks, watchdog, stacks
        self.names = labels(trace)
        killed = watchdog_killed(trace)   # (after a hang's verdict: not how a rank left)
        self.ended = {p.pid: p for p in trace.processes() if p.pid not in killed and
                      (p.exitcode is not None or p.signal is not None)}
        self.kind, self.sentence, self.lines = None, None, []

    # -- the words ------------------------------------------------------------------------------

    def headline(self, nkilled):
        """The verdict's first line, as stuck.headline words the others."""
        if self.kind == "failed":
            return [f"mpviz trace: FAILED ({self.r.library}) -- {self.sentence}"]
        head = {"deadlock": "DEADLOCK", "stalled": "STALLED"}[self.kind]
        return [f"mpviz trace: HANG: {head} ({self.r.library}) -- {self.sentence} "
                f"mpviz stopped {nkilled} process(es) with SIGKILL."]

    def who(self, pid):
        """"rank 1 (SpawnProcess-2, pid 4242)"; on host b of several (trace/merge.py): "rank 3
        (host b, SpawnProcess-2, pid 4242)", the pid as that host counts it."""
        rank = self.r.rank_of.get(pid)
        name = self.names.get(pid, "?")
        if hasattr(self.trace, "host_of"):
            name, pid = f"host {self.trace.host_of(pid)}, {name}", self.trace.real_pid(pid)
        return f"rank {rank} ({name}, pid {pid})" if rank is not None else f"{name} (pid {pid})"

    def how_it_ended(self, pid, after=""):
        """"raised ValueError: ... after collective #1 (exit code 1)", "called
        destroy_process_group() after collective #1 and exited with code 0", "was killed by
        SIGTERM"; None while it runs. `after`: " after collective #1", where it goes. What the
        rank did comes first: a rank that left its group is often killed later, as it exits
        (torch.multiprocessing.spawn ends the others when one fails)."""
        p = self.ended.get(pid)
        end = "" if p is None else f" (later it was killed by {p.signal})" if p.signal else \
            f" (exit code {p.exitcode})"
        if pid in self.r.raised:
            return f"raised {_own_fix(self.r.raised[pid])[0]}{after}{end}"
        if pid in self.r.destroyed:
            return f"called destroy_process_group(){after}" + (
                f" and exited with code {p.exitcode}" if p is not None and not p.signal else end)
        if p is None:
            return None
        if p.signal:
            return f"was killed by {p.signal}{after}"
        return f"exited with code {p.exitcode}{after}"

    def left_cleanly(self, pid):
        """It raised nothing, and left its group or ended with exit code 0 (or still runs)."""
        p = self.ended.get(pid)
        return pid not in self.r.raised and (pid in self.r.destroyed or p is None or
                                             p.exitcode == 0)

    def leaving(self, pid):
        """When rank `pid` began to leave: it raised, destroyed its group, or ended."""
        times = [self.r.raised_ns.get(pid), self.r.destroyed.get(pid),
                 getattr(self.ended.get(pid), "exit_ns", None)]
        return min([t for t in times if t is not None] or [0])

    def where(self, pid):
        """Where a rank that runs is, by /proc and its stack: "in `time.sleep` (a deadline) at
        load_batch (straggler.py:14): `time.sleep(60)`"; and how it waits ("sleep", ...)."""
        from . import stuck
        seen = self.watchdog.seen.get((pid, pid)) if self.watchdog else None
        if seen is None:
            return "running", None
        words = stuck.what(seen.view)
        calls = stuck._stacks_by_thread(self.trace, pid, ((self.stacks or {}).get(pid) or {})
                                        .get("stacks", "")).get(pid)
        own = stuck.own_line(calls)
        return (f"{words}" + (f" -- at {own}" if own else "")), seen.view.wait

    # -- the cases, in order ---------------------------------------------------------------------

    def rendezvous(self):
        """init_process_group: one that raised (a port in use), or ranks that never came."""
        r = self.r
        for pid, end in sorted(r.left.items(), key=lambda kv: kv[1].ts_ns):
            error = end.args.get("error")
            if not error:
                continue
            port = re.search(r"port: (\d+)", error)
            if "EADDRINUSE" in error and port:
                self.kind = "failed" if self.watchdog is None else self.kind_of_waits()
                # (the port is MASTER_PORT's with env://, else the one init_method names)
                method = str(end.args.get("init_method") or "env://")
                env = method == "env://"
                named = f"MASTER_PORT {port.group(1)}" if env else \
                    f"port {port.group(1)} (init_method {method})"
                where = "MASTER_PORT=..." if env else "init_method=..."
                self.sentence = (f"{self.who(pid)} could not open the rendezvous: {named} is "
                                 f"already in use (another program, or an earlier run that has "
                                 f"not ended, listens on it).")
                said = "torch" if self.r.library == "torch.distributed" else self.r.library
                self.lines = [f"  {said} said: {_own_fix(error)[0]}"] + self.waiting_lines(
                    but=pid) + [
                    f"  Fix: choose a free port ({where}), or end the program that "
                    f"holds {port.group(1)} (`ss -ltnp 'sport = :{port.group(1)}'` names it)."]
                return True
        waiting = [pid for pid in r.arrived if pid not in r.left or r.left[pid].args.get("error")]
        if not waiting:
            return False
        world = max(r.world.get(pid, 0) for pid in r.arrived)
        came = sorted(r.rank_of[pid] for pid in r.arrived if pid in r.rank_of)
        self.kind = "failed" if self.watchdog is None else self.kind_of_waits()
        self.sentence = (f"waiting for {world} ranks at the rendezvous; {len(r.arrived)} "
                         f"arrived ({_ranks(came)}).")
        never = [k for k in range(world) if k not in came]
        if never:
            self.lines.append(
                f"  {_ranks(never)} never arrived: no process of the program called "
                f"init_process_group as {_ranks(never)} (world_size is {world}; "
                f"{len(r.arrived)} process{'es' if len(r.arrived) > 1 else ''} did).")
        self.lines += self.waiting_lines()
        self.lines.append(f"  Fix: start as many processes as world_size says "
                          f"(mp.spawn(fn, args=(world_size,), nprocs=world_size)), or pass the "
                          f"world_size you start.")
        if never:            # (one host's trace cannot tell a missing process from a late host)
            self.lines.append(
                f"  Or, in a job of several hosts (torchrun --nnodes, two_hosts.py), "
                f"{_ranks(never)} {'is' if len(never) == 1 else 'are'} another host's, not "
                f"started yet: start every host's `mpviz trace` within --hang-after seconds of "
                f"the first (or give --hang-after more), then "
                f"mpviz.trace.load([folder_a, folder_b]).")
        return True

    def waiting_lines(self, but=None):
        out = []
        for pid, begin in sorted(self.r.arrived.items(),
                                 key=lambda kv: (self.r.rank_of.get(kv[0], 0), kv[1].ts_ns)):
            end = self.r.left.get(pid)
            if pid == but or (end is not None and not end.args.get("error")):
                continue
            line = f"  {self.who(pid)} "
            line += (f"raised in init_process_group: {_own_fix(end.args['error'])[0]}"
                     if end is not None
                     else "waits in init_process_group" if self.watchdog is not None
                     else "was still in init_process_group")
            ended = self.how_it_ended(pid)
            out.append(line + (f"; then it {ended}" if ended and end is None else ""))
        return out

    def disagree(self):
        """Two ranks at the same seq of a group, in different collectives."""
        by = {}
        for c in self.r.calls:
            if not c.p2p:                  # (a send and its recv are two ops that agree)
                by.setdefault((c.group, c.seq), {})[c.rank] = c
        for (group, seq), calls in sorted(by.items(), key=lambda kv: min(
                c.begin_ns for c in kv[1].values())):
            ops = {c.op for c in calls.values()}
            if len(ops) < 2:
                continue
            ranks = sorted(calls)
            still = [c for c in calls.values() if c.end_ns is None]
            self.kind = ("failed" if self.watchdog is None else
                         "deadlock" if still else self.kind_of_waits())
            self.sentence = (f"{_ranks(ranks)} disagree at collective #{seq}: " + ", ".join(
                f"{_ranks(sorted(k for k, c in calls.items() if c.op == op))} called {op} #{seq}"
                for op in sorted(ops, key=lambda o: min(k for k, c in calls.items()
                                                        if c.op == o))) +
                (f" (group {list(group)}); each waits for the others to join its own collective,"
                 f" which they never will." if still else f" (group {list(group)})."))
            for k in ranks:
                self.lines.append(f"  {self.who(calls[k].pid)}: {self.state(calls[k])}")
            self.lines.append(f"  Fix: {ORDER_FIX}; give every rank the same number of "
                              f"batches (DistributedSampler pads the shards to equal length).")
            return True
        return False

    def sizes_differ(self):
        """Every rank at the same seq of a group called the same collective, with tensors of
        different sizes: two different calls that share a name (one rank's gradient all_reduce,
        another's loss all_reduce). mpviz.distributed raises on every rank; gloo may not notice
        -- a rank completes it with a wrong result, another fails later ("Connection closed by
        peer"), and no recorded call is missing."""
        by = {}
        for c in self.r.calls:
            if not c.p2p and c.op in SAME_SIZE and c.nbytes is not None:
                by.setdefault((c.group, c.seq), {})[c.rank] = c
        for (group, seq), calls in sorted(by.items(), key=lambda kv: min(
                c.begin_ns for c in kv[1].values())):
            sizes = sorted({c.nbytes for c in calls.values()})
            if len(sizes) < 2 or len({c.op for c in calls.values()}) > 1:
                continue
            ranks, op = sorted(calls), calls[min(calls)].op
            still = [c for c in calls.values() if c.end_ns is None]
            self.kind = ("failed" if self.watchdog is None else
                         "deadlock" if still else self.kind_of_waits())
            self.sentence = (
                f"{_ranks(ranks)} disagree at collective #{seq}: each called {op} #{seq}, with "
                f"tensors of different sizes: " + ", ".join(
                    f"{_ranks(sorted(k for k, c in calls.items() if c.nbytes == n))} {n:,} bytes"
                    for n in sorted(sizes, key=lambda n: min(k for k, c in calls.items()
                                                             if c.nbytes == n)))
                + f" (group {list(group)}).")
            self.lines = [f"  {self.who(calls[k].pid)}: {self.state(calls[k])}" for k in ranks]
            done = [k for k in ranks if calls[k].end_ns is not None and not calls[k].error]
            if done:
                self.lines.append(
                    f"  {_ranks(done)}'s {op} #{seq} completed with no error, on tensors that "
                    f"do not match: {'its' if len(done) == 1 else 'their'} result is wrong "
                    f"({self.r.library} did not compare the sizes).")
            self.lines.append(
                f"  Fix: {ORDER_FIX}; and each call needs tensors of the same shape and dtype on "
                f"every rank (one name, two sizes: often two different calls that met, as when "
                f"one rank's loop ran shorter). Give every rank the same number of batches "
                f"(DistributedSampler pads the shards to equal length).")
            return True
        return False

    def state(self, call):
        """"waits in all_reduce #3 since 12.3 s", "raised in it: RuntimeError: ...", ..."""
        t = (call.begin_ns - self.trace.events[0].ts_ns) / 1e9
        name = _called(call)
        if call.error:
            return f"{name} (entered at {t:.1f} s) raised {_short(call.error)}"
        if call.end_ns is not None:
            return f"{name} completed"
        ended = self.how_it_ended(call.pid)
        if ended:
            return f"was in {name} (entered at {t:.1f} s) when it {ended}"
        return f"waits in {name} (entered at {t:.1f} s)"

    def missing(self):
        """A rank in a collective (or failed in one) that another rank of the group never
        called: that rank ended, is slow, or is elsewhere."""
        stuck_calls = [c for c in self.r.calls if not c.async_op and
                       (c.end_ns is None or c.error)]
        if not stuck_calls:
            return False
        # (a rank that raised in a collective of its own group before the backend ran it --
        # a bad argument -- is the cause, not a waiter: judge first a call whose group has a
        # rank missing from it, whichever began first)
        first = min(stuck_calls, key=lambda c: (not self.absent_from(c), c.seq, c.begin_ns))
        group, seq = first.group, first.seq
        mine = [c for c in self.r.calls if c.group == group and c.p2p == first.p2p]
        here = {c.rank: c for c in mine if c.seq == seq}
        last = {}
        for c in mine:
            last[c.rank] = max(last.get(c.rank, 0), c.seq or 0)
        name, needed = _called(first), _needed(first)   # (a recv needs its send)
        absent = [k for k in group if k not in here]
        waiting = sorted(here)
        lines = [f"  {self.who(here[k].pid)}: {self.state(here[k])}" for k in waiting]
        if not absent:
            return self.aborted(first, here, lines)
        kinds, sentences, ddp = [], [], False
        for k in absent:
            pid = self.r.pid_of.get(k)
            if pid is None:
                continue
            after = "" if first.p2p else f" after collective #{last.get(k, 0)}" if \
                last.get(k) else self.elsewhere_call(pid, group) or " before any collective"
            ended = self.how_it_ended(pid, after)
            gave_up = ended and first.end_ns is not None and self.leaving(pid) > first.end_ns
            if gave_up:             # it ended after the waiting rank gave up: not the cause
                kinds.append("gave up")
                sentences.append(
                    f"rank {first.rank} gave up waiting in {name} "
                    f"({_short(first.error or '')}): rank {k} had not called {needed} by then"
                    + ("" if first.p2p else f" -- its last collective was #{last.get(k, 0)}")
                    + f"; it was still running (later it {self.how_it_ended(pid)})")
                lines.append(f"  {self.who(pid)}: had not called {needed} when "
                             f"rank {first.rank} gave up; later it {self.how_it_ended(pid)}")
                continue
            if ended:
                kinds.append("deadlock")
                sentences.append(f"rank {k} {ended}, without calling {needed}")
                lines.append(f"  {self.who(pid)}: never called {needed}: it {ended}")
                continue
            if self.watchdog is None:        # (no /proc view: ended by a watchdog, say)
                kinds.append("gave up")
                sentences.append(f"rank {k} had not called {needed} when the trace ended" + (
                    "" if first.p2p else f" (its last collective was #{last.get(k, 0)})"))
                lines.append(f"  {self.who(pid)}: had not called {needed}")
                continue
            words, wait = self.where(pid)
            if wait not in ("sleep", "deadline", "running") and self.in_ddp_backward(pid):
                kinds.append("deadlock")
                ddp = True
                sentences.append(
                    f"rank {k} waits inside backward(), in DistributedDataParallel's "
                    f"gradient all-reduce (C++: not recorded, not counted in the #), not in "
                    f"{name}")
            elif wait in ("sleep", "deadline", "running"):
                kinds.append("stalled")
                sentences.append(f"rank {k} is slow, the others wait for it in {name}")
            else:
                kinds.append(self.kind_of_waits())
                sentences.append(f"rank {k} has not called {needed}: it waits elsewhere")
            lines.append(f"  {self.who(pid)}: has not called {needed} yet"
                         + (f" ({after[1:]})" if after else "") + f"; its main thread {words}")
        if not sentences:
            return self.elsewhere(first, [k for k in absent if k not in self.r.pid_of], lines)
        if "gave up" in kinds:
            self.kind, self.lines = "failed", lines + [
                f"  A rank slower than the timeout given to init_process_group, or one that "
                f"never calls the collective. Fix: find what rank {absent[0]} does instead "
                f"(mpviz trace --hang-after S shows where each rank is while the others "
                f"wait); if it is only slow, a longer timeout=."]
            self.sentence = "; ".join(sentences) + "."
            return True
        who = _ranks(waiting)
        verb = "waits" if len(waiting) == 1 else "wait"
        never = ", which can never complete."
        if self.watchdog is None:
            self.kind, verb, never = "failed", "waited", ", which could never complete."
        else:
            self.kind = "deadlock" if "deadlock" in kinds else \
                "stalled" if "stalled" in kinds else kinds[0]
        self.sentence = f"{'; '.join(sentences)}: {who} {verb} in {name}" + (
            never if "deadlock" in kinds else ".")
        self.lines = lines
        if ddp:
            self.lines.append(DDP_FIX)
        elif "deadlock" in kinds and first.p2p and all(
                self.left_cleanly(self.r.pid_of.get(k)) for k in absent):
            self.lines.append(f"  Fix: each recv(src=S) on rank D needs a send(dst=D) on rank "
                              f"S, one for one (and each send a recv): rank {first.rank}'s "
                              f"{name} has no {needed} -- check the dst and src each rank "
                              f"passes.")
        elif "deadlock" in kinds and all(self.left_cleanly(self.r.pid_of.get(k))
                                         for k in absent):
            self.lines.append(f"  Fix: {ORDER_FIX}; a rank that ends while the others still "
                              f"call collectives leaves them waiting (a collective inside "
                              f"`if rank == 0:`: call it on every rank, and use its result on "
                              f"rank 0 only).")
        elif "deadlock" in kinds:
            self.lines.append(self.failed_fix(absent))
        elif "stalled" in kinds:
            self.lines.append("  When the slow rank gets there, the collective completes: "
                              "not a deadlock (if it never calls it -- a collective inside "
                              "`if rank == ...:` -- it is one). Fix: find why that rank is slow "
                              "(its line above); give the ranks equal work; a longer "
                              "--hang-after waits for it.")
        return True

    def after_destroy(self):
        """The program hangs, every collective completed, and a rank that destroyed its group
        has not exited since: what holds it is after torch.distributed (its own teardown, in
        native code, or the program's code after it). The others -- the parent joining the
        ranks -- wait for it to exit."""
        if self.watchdog is None:
            return False
        if any(c.end_ns is None or c.error for c in self.r.calls):
            return False
        never = set(getattr(self.watchdog, "stuck_pids", None) or ())   # (can never move)
        stuck = []
        for k, pid in sorted(self.r.pid_of.items()):
            if pid in self.r.destroyed and pid not in self.ended:
                words, wait = self.where(pid)
                # (a rank still on its way out -- running, at a loaded machine's pace -- is
                # not the one that holds the others; one that can never move is)
                if (pid in never) if never else wait not in ("running", None):
                    stuck.append((k, pid, words))
        if not stuck:
            return False
        t0 = self.trace.events[0].ts_ns
        self.kind = self.kind_of_waits()
        lines, native = [], False
        for k, pid, words in stuck:
            native = native or "-- at" not in words     # (no line of Python's: native code)
            lines.append(f"  {self.who(pid)}: called destroy_process_group() at "
                         f"{(self.r.destroyed[pid] - t0) / 1e9:.1f} s and has not exited "
                         f"since; its main thread {words}")
        who = _ranks([k for k, _, _ in stuck])
        self.sentence = (f"every collective completed, and {who} destroyed "
                         f"{'its' if len(stuck) == 1 else 'their'} group, but "
                         f"{'has' if len(stuck) == 1 else 'have'} not exited: whoever joins "
                         f"the ranks (torch.multiprocessing.spawn's join) waits for "
                         f"{'it' if len(stuck) == 1 else 'them'}.")
        if native:
            self.lines = lines + [
                "  After destroy_process_group() a rank has only its own code and torch's "
                "teardown left, and no line of Python is running: native code (seen with torch "
                "2.13 and gloo: ~ProcessGroupGloo waiting on a mutex for ever, as the last "
                "reference to a DistributedDataParallel model went when the rank's function "
                "returned).",
                "  Fix: keep the DDP model referenced until the process exits (a module-level "
                "list), or end the rank with os._exit(0) once its results are saved -- nothing "
                "of the group is needed after destroy_process_group()."]
        else:
            self.lines = lines + [
                "  Fix: what it waits for is the program's own, after the group (its line "
                "above; the stacks below say how it got there) -- not torch.distributed's."]
        return True

    def absent_from(self, call):
        """The ranks of `call`'s group that never called it (the same seq, the same kind)."""
        came = {c.rank for c in self.r.calls if c.group == call.group and c.seq == call.seq
                and c.p2p == call.p2p}
        return [k for k in call.group if k not in came]

    def each_end(self):
        """The program failed and no case above fits: say how each rank ended, where, and
        what it was in -- never no verdict at all."""
        if self.watchdog is not None or not self.r.rank_of:
            return False
        parts, lines = [], []
        for k, pid in sorted(self.r.pid_of.items()):
            open_ = [c for c in self.r.calls if c.pid == pid and (c.end_ns is None or c.error)]
            ended = self.how_it_ended(pid)
            where = f" in {_called(open_[-1])}" if open_ else ""
            if ended is None:
                ended = "had not ended when the trace did"
            elif pid not in self.r.raised and open_ and open_[-1].end_ns is None:
                ended = f"{ended}{where}"
                where = ""
            elif pid in self.r.raised and where:
                ended = ended.replace(" (", f"{where} (", 1) if " (" in ended else \
                    ended + where
                where = ""
            parts.append(f"rank {k} {ended}")
            lines.append(f"  {self.who(pid)}: {ended}")
        if not any(pid in self.r.raised or not self.left_cleanly(pid)
                   for pid in self.r.pid_of.values()):
            return False
        self.kind = "failed"
        self.sentence = "; ".join(parts) + "."
        raised = [k for k, pid in sorted(self.r.pid_of.items()) if pid in self.r.raised]
        where = {(c.group, c.seq, c.op, _short(c.error)) for c in self.r.calls if c.error}
        if len(raised) == len(self.r.pid_of) and len(where) == 1:
            group, seq, op, error = where.pop()    # the same error, in the same call, on all
            self.sentence = (f"every rank ({_ranks(raised)}) raised {error} in {op} #{seq}"
                             f"{'' if len(group) == len(raised) else f' of group {list(group)}'}"
                             f": the call itself failed, on each rank alike; no rank waited "
                             f"for another.")
            self.lines = lines + [f"  Fix: the error names what is wrong with the call (its "
                                  f"arguments: a rank number, a tensor, a group); its traceback "
                                  f"is above."]
            return True
        self.lines = lines + [self.failed_fix(raised)]
        return True

    def failed_fix(self, failed):
        """The Fix for ranks that waited for ranks `failed`, one of which raised: the fix its
        own error gives, where it gives one (mpviz's errors do: quoted once, here)."""
        for k in failed:
            error = self.r.raised.get(self.r.pid_of.get(k))
            fix = _own_fix(error)[1] if error else None
            if fix:
                return (f"  Fix (rank {k}'s error says it; its traceback is above): {fix}; "
                        f"the others only waited for it.")
        return "  Fix: read the traceback of the rank that failed (above); the others only " \
               "waited for it."

    def elsewhere_call(self, pid, group):
        """" in broadcast #1 of group [1, 2]": the last collective of another group that rank
        `pid` called (it raised in it, or left after it), else None."""
        calls = [c for c in self.r.calls if c.pid == pid and not c.p2p and c.group != group]
        if not calls:
            return None
        c = max(calls, key=lambda c: c.begin_ns)
        return f" {'in' if c.error else 'after'} {_called(c)} of group {list(c.group)}"

    def elsewhere(self, first, absent, lines):
        """The ranks `first` waits for are in no process of this trace: another host's (each
        host traced apart), or started outside ``mpviz trace``."""
        if not absent:
            return False
        waiting = sorted(c.rank for c in self.r.calls if c.group == first.group and
                         c.seq == first.seq and c.p2p == first.p2p)
        self.kind = "failed" if self.watchdog is None else self.kind_of_waits()
        verb = ("waited" if self.watchdog is None else "waits" if len(waiting) == 1 else "wait")
        self.sentence = (f"{_ranks(waiting)} {verb} in {_called(first)} for {_ranks(absent)}, "
                         f"which {'is' if len(absent) == 1 else 'are'} in no process of this "
                         f"trace: another host's ranks, or ranks started outside mpviz trace.")
        self.lines = lines + [
            f"  What {_ranks(absent)} did is not here. Fix: trace every host's ranks (`python -m "
            f"mpviz trace -o FOLDER` on each) and load the folders together: "
            f"mpviz.trace.load([folder_a, folder_b]) judges the whole job."]
        return True

    def aborted(self, first, here, lines):
        """Every rank of the group called `first`, and one was killed by a signal inside it
        (not by the watchdog, not by spawn's SIGTERM to the others): the backend ended it
        there -- gloo aborts a rank whose collective's sizes differ from the others'."""
        dead = [c for c in here.values() if c.end_ns is None and c.pid in self.ended and
                self.ended[c.pid].signal not in (None, "SIGTERM", "SIGKILL")]
        if not dead:
            return False
        c = min(dead, key=lambda c: self.leaving(c.pid))
        signal = self.ended[c.pid].signal
        self.kind = "failed" if self.watchdog is None else "deadlock"
        self.sentence = (f"rank {c.rank} was killed by {signal} inside {_called(c)}, which "
                         f"every rank of its group had called ({_ranks(sorted(here))}): the "
                         f"backend ended it there.")
        self.lines = lines + [
            f"  Its own words are above, on stderr: gloo aborts a rank ('Received data size "
            f"doesn't match expected size') when the ranks' tensors differ in size. Fix: give "
            f"{first.op} tensors of the same shape and dtype on every rank (sizes that differ: "
            f"pad to the largest, or all_gather_object)."]
        return True

    def raised_in_backward(self):
        """A rank whose exception came out of backward() -- DDP's gradient all-reduce, not
        recorded -- outside every recorded collective: gloo's "Connection closed by peer" when
        another rank had left (uneven inputs), or its timeout when it waits elsewhere."""
        r = self.r
        for pid in sorted(r.in_backward, key=lambda p: r.raised_ns[p]):
            if any(c.pid == pid and (c.end_ns is None or c.error) for c in r.calls):
                continue                     # (it raised in a recorded one: missing() said)
            others, failed = [], []
            for k, q in sorted((k, q) for q, k in r.rank_of.items() if q != pid):
                began = [c for c in r.calls if c.pid == q and c.begin_ns < r.raised_ns[pid]]
                open_ = [c for c in began if c.end_ns is None or c.end_ns > r.raised_ns[pid]]
                last = max((c.seq for c in began if not c.p2p), default=0)
                after = f" after collective #{last}" if last else " before any collective"
                if open_:
                    others.append(f"rank {k} was in {_called(open_[0])}")
                elif 0 < self.leaving(q) <= r.raised_ns[pid]:
                    others.append(f"rank {k} {self.how_it_ended(q, after)}")
                    failed += [] if self.left_cleanly(q) else [k]
            if not others:
                continue
            self.kind = "failed"
            self.sentence = (f"rank {r.rank_of.get(pid)} raised {_short(r.raised[pid])} inside "
                             f"backward(), in DistributedDataParallel's gradient all-reduce "
                             f"(C++: not recorded), which the other ranks never joined: "
                             f"{'; '.join(others)}.")
            self.lines = [f"  {self.who(pid)}: raised {_short(r.raised[pid])} in backward()",
                          f"  Fix: read the traceback of {_ranks(failed)} (above); rank "
                          f"{r.rank_of.get(pid)} only waited for it." if failed else DDP_FIX]
            return True
        return False

    def in_ddp_backward(self, pid):
        """Rank `pid` built a DistributedDataParallel and its main thread is inside autograd's
        backward(): there its Reducer all-reduces the gradients with the group -- a collective
        as real as the recorded ones, seen only by its stack (dist_hooks.py says why)."""
        from . import stuck
        if not any(e.pid == pid and e.args.get("what") == DDP_NOTE
                   for e in self.trace.of_kind("not_recorded")):
            return False
        calls = stuck._stacks_by_thread(self.trace, pid, ((self.stacks or {}).get(pid) or {})
                                        .get("stacks", "")).get(pid)
        return any(fn == "backward" and f"torch{os.sep}" in path for fn, path, _ in calls or ())

    def kind_of_waits(self):
        """The watchdog's own judgement (by /proc), for what the events do not settle."""
        return getattr(self.watchdog, "kind", None) or "stalled"


def watchdog_killed(trace):
    return {pid for e in trace.of_kind("watchdog.kill") for pid in e.args.get("pids", ())}


def _short(error):
    """gloo's error without its source path and its advice: "RuntimeError: Connection closed
    by peer [127.0.0.1]:33186" (the whole text is in the rank's traceback and the trace)."""
    error = re.sub(r"\[/[^\]]*\] ", "", error)
    kind, _, text = error.partition(": ")
    return f"{kind}: {text.split('. ')[0]}" if text else error


def _own_fix(error):
    """(`error` up to its own "Why: ..." or "Fix: ...", its fix or None): an mpviz error says
    how to fix it, and a verdict that quotes one says one Fix, not two."""
    text, _, fix = error.partition(" Fix: ")
    cut = text.split(" Why: ")[0].rstrip()
    return cut.rstrip(".") if cut != error else error, fix.strip().rstrip(".") or None


def _called(call):
    """"all_reduce #3"; a point-to-point call names its peer: "recv #1 from rank 0"."""
    if not call.p2p:
        return f"{call.op} #{call.seq}"
    src, dst = call.group if len(call.group) == 2 else (None, call.group[0])
    sends = P2P[call.op] == "send"
    peer = dst if sends else src
    return f"{call.op} #{call.seq} " + ("to " if sends else "from ") + (
        f"rank {peer}" if peer is not None else "any rank")


def _needed(call):
    """What the missing rank must call to end `call`: the same collective, or its match
    ("send #1 to rank 2" for rank 2's "recv #1 from rank 0")."""
    if not call.p2p or len(call.group) != 2:
        return _called(call)
    src, dst = call.group
    if P2P[call.op] == "send":
        return f"recv #{call.seq} from rank {src}"
    return f"send #{call.seq} to rank {dst}"


def _ranks(ranks):
    """"rank 0", "ranks 0 and 1", "ranks 0, 1 and 2"."""
    ranks = [str(k) for k in ranks]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(ranks[:-1]) + " and " + ranks[-1]
