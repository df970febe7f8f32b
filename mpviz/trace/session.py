"""A run's processes and what they leave behind: its session, their stacks, its /dev/shm names.

Both watchers of a run use these -- the scenarios' runner (scenarios/runner.py) and the hang
watchdog of ``mpviz trace`` and ``record(hang_after=S)`` (watchdog.py) -- and so does the
stepper. A run is started in a session of its own (``start_new_session=True``): every process
it starts inherits the session id, even one whose parent died and which was re-parented to
init, so "the run's processes" is "the processes of the session" (``session_pids``), read from
/proc through mpviz/_proc.py.

    session_pids(sid), session_cpu(sid)   who is alive in it; the CPU they used (progress)
    kill_session(sid, proc, graceful)     nothing left: resource trackers last, so that they
                                          unlink the semaphores they track
    capture_stacks(pids, names, dir)      SIGUSR1: faulthandler writes each one's stacks
    run_segments(trace), remove_segments  the /dev/shm names the trace says the run created,
                                          unlinked if still there
"""
import os
import signal
import subprocess
import time

from .. import _proc


def capture_stacks(pids, names, stacks_dir):
    """``{pid: {"name", "stacks"}}``: SIGUSR1 to each of `pids`, whose faulthandler (registered
    at start-up: autostart.register_stacks, or the scenarios' _site/sitecustomize.py) appends its
    threads' stacks to STACKS_DIR/PID.txt."""
    sizes, blind = {}, {}
    for pid in pids:
        path = os.path.join(stacks_dir, f"{pid}.txt")
        sizes[pid] = _size(path)
        if not os.path.exists(path):
            blind[pid] = ("(no stacks captured: it was still starting -- mpviz's start-up in "
                          "it had not yet opened the file its stacks go to)")
            continue
        if not _holds_open(pid, path):
            blind[pid] = (f"(no stacks captured: the process closed the file its stacks go to "
                          f"-- os.closerange? -- and SIGUSR1 would write them into whatever "
                          f"file now has that number, maybe one of its own; not sent)")
            continue
        try:
            _ask_for_stacks(pid)
        except OSError:
            pass
    pids = [pid for pid in pids if pid not in blind]
    deadline = time.monotonic() + 1.5
    last, stable_since = None, time.monotonic()
    while time.monotonic() < deadline:          # until every file has grown and settled
        now_sizes = {pid: _size(os.path.join(stacks_dir, f"{pid}.txt")) for pid in pids}
        if now_sizes != last:
            last, stable_since = now_sizes, time.monotonic()
        elif all(now_sizes[p] > sizes[p] for p in pids) and \
                time.monotonic() - stable_since > 0.1:
            break
        time.sleep(0.02)     # polling a file written by a signal handler; bounded
    out = {}
    for pid in pids:
        text = read_text(os.path.join(stacks_dir, f"{pid}.txt"))[sizes[pid]:]
        out[pid] = {"name": names.get(pid), "stacks": text.strip() or "(no stacks captured)"}
    for pid, why in blind.items():
        out[pid] = {"name": names.get(pid), "stacks": why}
    return out


def _ask_for_stacks(pid):
    """SIGUSR1 to `pid` -- to the one thread of it that runs, if exactly one does.

    faulthandler writes every thread's stacks from inside the signal handler, without the GIL,
    so it walks the frames of whatever thread runs Python meanwhile -- and crashed so
    (hang_logging_pool.py's busy logging thread: 3-4 runs in 24 under load). Only a thread that
    holds the GIL runs Python, and it shows as running (state R): handed the signal itself, it
    is inside the handler while its frames are read, and the others wait for the GIL. With no
    thread running, any may take it (the process); with several, the one with the GIL cannot be
    told from those in C code: looked at again, a few times, for a moment when one runs or none
    does; else the process takes it, as before."""
    for _ in range(10):
        running = [tid for tid in (_proc.threads(pid) or ())
                   if getattr(_proc.stat(pid, tid), "state", None) == "R"]
        if len(running) == 1 and _tgkill(pid, running[0], signal.SIGUSR1):
            return
        if len(running) <= 1:
            break
        time.sleep(0.002)     # (polling /proc: a moment when fewer run; bounded, 20 ms)
    os.kill(pid, signal.SIGUSR1)


def _tgkill(pid, tid, sig):
    """Send `sig` to thread `tid` of process `pid` (tgkill(2)); False where it cannot be sent
    so (no such call here), True once sent. OSError as os.kill's (the thread is gone)."""
    import ctypes
    import errno
    global _tgkill_call
    if _tgkill_call is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _tgkill_call = getattr(libc, "tgkill", False)        # glibc >= 2.30
    if not _tgkill_call:
        return False
    if _tgkill_call(ctypes.c_int(pid), ctypes.c_int(tid), ctypes.c_int(sig)) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number or errno.ESRCH))
    return True


_tgkill_call = None


def _holds_open(pid, path):
    """Does `pid` still have `path` open (faulthandler writes its stacks there)? True when
    /proc cannot tell (not ours to read): then SIGUSR1 is sent as before."""
    files = _proc.open_files(pid)
    if files is None:
        return True                        # /proc cannot tell: signal it as before
    return os.path.realpath(path) in files.values()


def session_pids(sid):
    """Live (not zombie) processes of session `sid`."""
    out = []
    for pid in _proc.pids():
        st = _proc.stat(pid)
        if _proc.alive(st) and st.session == sid:
            out.append(pid)
    return out


def session_cpu(sid):
    total = 0.0
    for pid in session_pids(sid):
        st = _proc.stat(pid)
        if st is not None:                 # (gone since: its time is no longer counted)
            total += st.cpu_seconds
    return total


def _is_resource_tracker(pid):
    cmd = _proc.cmdline(pid)               # None: gone, so not a tracker left to wait for
    return cmd is not None and b"resource_tracker" in cmd


def kill_session(sid, proc, graceful):
    """Make sure no process of session `sid` is left; return the pids that had to be killed.

    `graceful`: the driver finished by itself; give its helpers (fork server, resource tracker)
    a moment to exit on their own first.
    """
    killed = []
    if graceful:
        deadline = time.monotonic() + 2.0
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.02)     # helpers exit when the driver's pipes close; bounded
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:     # everything but the resource trackers first ...
        others = [p for p in session_pids(sid) if not _is_resource_tracker(p)]
        if not others:
            break
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
            except OSError:
                pass
        proc.poll()
        time.sleep(0.02)
    deadline = time.monotonic() + 2.0      # ... which unlink their semaphores when all are gone
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return killed


def run_segments(trace):
    """/dev/shm names (with the leading '/') that this run's trace says it created."""
    names = set()
    for e in trace.events:
        if e.kind == "shm.create" and e.args.get("name"):
            names.add(e.args["name"])
        elif e.kind == "cuda.alloc" and e.args.get("block"):
            names.add(e.args["block"])
    pids = {str(p.pid) for p in trace.processes()}
    try:
        entries = os.listdir("/dev/shm")
    except OSError:
        entries = []
    for entry in entries:           # CUDA simulator blocks and counters carry their owner's pid
        for prefix in ("mpviz_cuda_", "mpviz_cudarc_"):
            if entry.startswith(prefix) and entry[len(prefix):].split("_")[0] in pids:
                names.add("/" + entry)
    return sorted(n if n.startswith("/") else "/" + n for n in names)


def remove_segments(trace, wait):
    """Unlink this run's segments that are still in /dev/shm; return their names."""
    left = [n for n in run_segments(trace) if os.path.exists("/dev/shm" + n)]
    deadline = time.monotonic() + wait
    while left and time.monotonic() < deadline:   # the shm manager may be removing them now
        time.sleep(0.05)
        left = [n for n in left if os.path.exists("/dev/shm" + n)]
    removed = []
    for name in left:
        try:
            os.unlink("/dev/shm" + name)
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""

