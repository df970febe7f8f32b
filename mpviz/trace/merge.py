"""Several hosts' traces as one: ``mpviz.trace.load([dir_a, dir_b])``, clocks aligned at rendezvous.

When a class outgrows one machine, each machine runs its own ranks (torchrun, or mp.spawn with
a node rank) under ``mpviz trace``, and each writes its own folder. Two things keep those
folders apart, and this module undoes both::

    pids      each machine counts its own: host a's pid 4242 and host b's may both exist.
              Host k's pids (and ids made of pids: messages, pipes, threading locks) are
              moved up by k * PID_STRIDE, above any Linux pid: b's 4242 is 10004242.
              Host a's keep their numbers; ``trace.hosts`` says which host each came from.
    clocks    each machine's time.monotonic_ns() counts from its own boot. Host k's events
              are moved by its estimated offset to host a's clock.

The offset comes from the rendezvous. Every rank leaves init_process_group at about the same
instant (the store lets none go before all arrived), so the mean of host a's rendezvous ends
minus the mean of host k's is the estimate. How far to trust it is bounded by causality:
no rank leaves the rendezvous, an all_reduce, all_gather, reduce_scatter or barrier before
every rank of it entered (a recv ends after its send began), so each such meeting of a rank
of a and a rank of k gives a bound::

    offset >= begin on a - end on k        offset <= end on a - begin on k

The estimate is kept inside the tightest of these bounds, and the uncertainty said is its
distance to the farther bound: the truth cannot be further away, unless a clock jumped or
drifted during the run. The Trace's ``notes`` say both.
"""
import os
import re
from statistics import fmean
from typing import NamedTuple

from .dist_verdict import Ranks, judge
from .trace import Trace, load as load_one

PID_STRIDE = 10_000_000     # above Linux's largest pid (4,194,304): host k's pid p is k*STRIDE+p
MEETINGS = {"all_reduce", "all_gather", "reduce_scatter", "barrier", "all_to_all",
            "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"}
# The args that hold a pid (moved with the host's pids), and those that hold an id made of one.
PID_ARGS = {"child", "ppid", "producer", "pid"}
ID_ARGS = {"queue", "msg", "lock", "pipe", "block", "token", "data_queue"}
NAMED_THINGS = ("shm.", "copy", "fd.")         # kinds whose `name` is a segment's, not a process's
_PID_IN_ID = re.compile(r"^(t|pipe-|args-)?(\d+)(\D.*)?$")   # t<pid>.<n>, pipe-<pid>-<fd>, <pid>.n


class Host(NamedTuple):
    """One folder of a merged trace: its name in pictures, where its pids start, and its clock's
    offset to the first host's (ns, added to its times) with the uncertainty of that offset."""
    name: str
    path: str
    pid_base: int
    offset_ns: int
    uncertainty_ns: int


class MergedTrace(Trace):
    """A ``Trace`` made of several hosts' traces (see the top). ``hosts``: one ``Host`` each;
    ``host_of(pid)`` / ``real_pid(pid)``: where a process ran, and its pid there."""

    def __init__(self, events, hosts, notes, verdict=None):
        super().__init__(None, events)
        self.hosts, self._notes, self.verdict = hosts, notes, verdict

    def host_of(self, pid):
        return self.hosts[min(pid // PID_STRIDE, len(self.hosts) - 1)].name

    def real_pid(self, pid):
        return pid % PID_STRIDE

    def label(self, pid, label):
        """A lane's or a verdict's name for `pid`, with its host: "b: rank 2"."""
        return f"{self.host_of(pid)}: {label}"


def merge(paths):
    """One ``MergedTrace`` of the traces at `paths` (folders, or Traces already loaded),
    the first host's clock for all. Raises ValueError / FileNotFoundError with a Fix."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not hasattr(paths, "__iter__"):
        raise TypeError(f"merge() takes a list of trace folders, not {type(paths).__name__}. "
                        f"Fix: mpviz.trace.load([dir_a, dir_b]).")
    paths = list(paths)
    if not paths:
        raise ValueError("load([]): no trace to load. Why: merging needs one trace folder per "
                         "host. Fix: mpviz.trace.load(['host_a/trace', 'host_b/trace']) (one "
                         "folder: load('trace')).")
    _no_folder_twice(paths)
    traces = [_read(p) for p in paths]
    names = _host_names(paths)
    rendezvous = [_rendezvous(t, name, p) for t, name, p in zip(traces, names, paths)]
    _same_job(rendezvous, names, traces)
    hosts, events, notes = [], [], []
    for k, (trace, name, path) in enumerate(zip(traces, names, paths)):
        offset, uncertainty = _offset(traces[0], trace, names[0], name) if k else (0, 0)
        host = Host(name, _where(path), k * PID_STRIDE, offset, uncertainty)
        hosts.append(host)
        events += [_moved(e, host) for e in trace.events]
        if k:         # (what the recorder cannot know: how the hosts' clocks relate)
            notes.append(
                f"the hosts' clocks: each host counts its own time; host {name}'s was moved onto "
                f"host {names[0]}'s by {offset / 1e6:+.3f} ms ± {uncertainty / 1e6:.3f} ms, "
                f"estimated at the rendezvous (the truth lies within ±: no rank leaves a "
                f"rendezvous, all_reduce or barrier before all its ranks entered it), so events "
                f"of two hosts closer than that may be drawn in the wrong order (host {name}: "
                f"{host.path}, its pids shown + {host.pid_base})")
        notes += [f"host {name}: {line}" for line in trace._file_notes()]   # (its events
        # say the rest: the merged trace reads them again, with every host's pids)
    merged = MergedTrace(events, hosts, notes)
    judged = judge(merged)                      # (the verdict of the whole job, not each host's)
    if judged is not None:
        merged.verdict = "\n".join(judged.headline(0) + judged.lines)
    else:
        said = [f"host {n}: {t.verdict}" for n, t in zip(names, traces) if t.verdict]
        merged.verdict = "\n".join(said) or None
    return merged


def _read(path):
    if isinstance(path, Trace):
        return path
    folder = os.fspath(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"load([...]): {folder!r} is not a folder. Why: each host's "
                                f"`mpviz trace -o FOLDER` writes one. Fix: pass those folders.")
    if not any(n.endswith(".mpvlog") for n in os.listdir(folder)):
        raise ValueError(f"load([...]): {folder!r} is not a trace: it holds no .mpvlog file. "
                         f"Why: `mpviz trace -o FOLDER` (or record(FOLDER)) leaves one log per "
                         f"process there. Fix: pass the folder given to -o on each host.")
    return load_one(folder)


def _where(path):
    return path.path or "a Trace in memory" if isinstance(path, Trace) else os.fspath(path)


def _host_names(paths):
    """Each host's name: its folder's (or the folder above a folder named 'trace'), else a, b .."""
    names = []
    for k, p in enumerate(paths):
        where = getattr(p, "path", None) if isinstance(p, Trace) else os.fspath(p)
        where = os.path.normpath(where) if where else ""
        name = os.path.basename(where)
        if name in ("trace", "mpviz-trace"):
            name = os.path.basename(os.path.dirname(where))
        names.append(name or chr(ord("a") + k))
    if len(set(names)) < len(names):                  # (two folders of the same name)
        names = [chr(ord("a") + k) for k in range(len(paths))]
    return names


def _no_folder_twice(paths):
    """The same trace folder given twice is a slip, said as one (not as a rank seen twice)."""
    seen = {}
    for p in paths:
        where = getattr(p, "path", None) if isinstance(p, Trace) else os.fspath(p)
        if not where:
            continue
        key = os.path.realpath(where)
        if key in seen:
            raise ValueError(
                f"load([...]): the folder {_where(p)} is given twice. Why: each host's trace is "
                f"merged once; the same ranks twice would be two runs of one job. Fix: pass "
                f"each host's folder once: load([host_a_folder, host_b_folder]).")
        seen[key] = p


def _rendezvous(trace, name, path):
    """{rank: (begin_ns, end_ns, world_size)} of the ranks that joined, in this trace."""
    ranks = Ranks(trace)
    out = {}
    for pid, end in ranks.left.items():
        if end.args.get("error") or pid not in ranks.rank_of or pid not in ranks.arrived:
            continue
        out[ranks.rank_of[pid]] = (ranks.arrived[pid].ts_ns, end.ts_ns, ranks.world.get(pid))
    if not out:
        raise ValueError(
            f"load([...]): the trace of host {name} ({_where(path)}) has no completed "
            f"rendezvous: no rank of it left init_process_group. Why: the hosts' clocks are "
            f"aligned at the rendezvous, and its ranks are how the hosts are told apart. Fix: "
            f"trace a program that calls init_process_group on every host (torch.distributed "
            f"or mpviz.distributed), and load its one-host trace alone with load(folder).")
    return out


def _same_job(rendezvous, names, traces):
    """Each rank once, one world size: else these are traces of different jobs."""
    seen = {}
    for name, ranks in zip(names, rendezvous):
        for rank in sorted(ranks):          # (the lowest rank named: the same words every run)
            if rank in seen:
                raise ValueError(
                    f"load([...]): rank {rank} is in the traces of hosts {seen[rank]} and "
                    f"{name}. Why: in one job each rank runs once, so these are two runs (two "
                    f"jobs, or the same host traced twice), with no common rendezvous to align "
                    f"their clocks at. Fix: pass one folder per host of the same run.")
            seen[rank] = name
    libraries = {}
    for name, trace in zip(names, traces):
        for e in trace.of_kind("dist.rendezvous"):
            libraries.setdefault((e.args.get("library"), e.args.get("backend")), name)
    if len(libraries) > 1:
        said = "; ".join(f"host {name}: {lib} backend {backend!r}"
                         for (lib, backend), name in libraries.items())
        raise ValueError(
            f"load([...]): the hosts' ranks joined different kinds of group ({said}): these "
            f"are traces of different jobs, with no common rendezvous. Fix: pass one folder "
            f"per host of the same run.")
    worlds = {w for ranks in rendezvous for _, _, w in ranks.values() if w}
    if len(worlds) > 1:
        raise ValueError(
            f"load([...]): the hosts' ranks were told different world sizes "
            f"({', '.join(map(str, sorted(worlds)))}): these are traces of different jobs. Fix: "
            f"pass one folder per host of the same run.")


def _offset(first, other, name_a, name_k):
    """(offset_ns, uncertainty_ns) that move `other`'s clock onto `first`'s."""
    a, k = _rendezvous(first, name_a, first), _rendezvous(other, name_k, other)
    estimate = fmean(end for _, end, _ in a.values()) - fmean(end for _, end, _ in k.values())
    low, high = -float("inf"), float("inf")
    for begin_a, end_a, begin_k, end_k in _meetings(first, other, a, k):
        low, high = max(low, begin_a - end_k), min(high, end_a - begin_k)
    if low > high:
        raise ValueError(
            f"load([...]): hosts {name_a} and {name_k} cannot be one run: no clock offset lets "
            f"every rank leave each meeting (the rendezvous, an all_reduce ...) after all its "
            f"ranks entered it. Why: these are traces of different runs. Fix: pass one folder per "
            f"host of the same run.")
    offset = round(min(max(estimate, low), high))
    return offset, round(max(offset - low, high - offset))


def _meetings(first, other, a, k):
    """(begin on a, end on a, begin on k, end on k) for each pair of ranks, one on each host,
    at the same meeting: the rendezvous, each collective every rank leaves only after all
    entered (MEETINGS), each send (begin) and its recv (end)."""
    for (ba, ea, _) in a.values():
        for (bk, ek, _) in k.values():
            yield ba, ea, bk, ek
    calls = {}
    for host, trace in ((0, first), (1, other)):
        for c in Ranks(trace).calls:
            if c.end_ns is None or c.error:
                continue
            key = (c.group, c.seq, c.op if not c.p2p else "p2p")
            if c.p2p or c.op in MEETINGS:
                calls.setdefault(key, ([], []))[host].append(c)
    for (group, seq, op), (on_a, on_k) in calls.items():
        for ca in on_a:
            for ck in on_k:
                if op != "p2p":
                    yield ca.begin_ns, ca.end_ns, ck.begin_ns, ck.end_ns
                elif ca.op in ("send", "isend") and ck.op in ("recv", "irecv"):
                    yield ca.begin_ns, float("inf"), -float("inf"), ck.end_ns  # recv ends after
                elif ck.op in ("send", "isend") and ca.op in ("recv", "irecv"):
                    yield -float("inf"), ca.end_ns, ck.begin_ns, float("inf")  # its send began


def _moved(e, host):
    """Event `e` of `host`, on the first host's clock, its pids and ids kept apart."""
    if not host.pid_base and not host.offset_ns:
        return e
    args = e.args
    if host.pid_base and args:
        args = dict(args)
        for key, value in args.items():
            if key in PID_ARGS and isinstance(value, int):
                args[key] = value + host.pid_base
            elif key == "pids" and isinstance(value, (list, tuple)):
                args[key] = [p + host.pid_base if isinstance(p, int) else p for p in value]
            elif key in ID_ARGS or key == "id" or (key == "name" and e.kind.startswith(
                    NAMED_THINGS)):
                args[key] = _id(value, host)
    return e._replace(ts_ns=e.ts_ns + host.offset_ns, pid=e.pid + host.pid_base,
                      tid=(e.tid + host.pid_base if isinstance(e.tid, int) else e.tid),
                      args=args)


def _id(value, host):
    """An id of `host`'s, apart from every other host's: the pid in it moved ("t4242.1" ->
    "t10004242.1"), else the host's name before it ("b/sem-7f3a...")."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value + host.pid_base                 # (a wait's id: a pid or a thread's)
    if not isinstance(value, str):
        return value
    m = _PID_IN_ID.match(value)
    if m:
        return f"{m.group(1) or ''}{int(m.group(2)) + host.pid_base}{m.group(3) or ''}"
    return f"{host.name}/{value}"
