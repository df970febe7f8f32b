"""The workers and small drivers of notebook 14 (debugging child processes).

Each function here runs in a child process, or starts a small "parent" program that stands for
a Jupyter kernel, so that the notebook can do to it what Jupyter does to a kernel (interrupt it,
kill it) without doing it to itself::

    notebook (this kernel)
      └─ subprocess: python -c "parent_main(...)"     its own session, like a kernel that
           ├─ child (fork)                            jupyter_client starts; the notebook
           └─ child (spawn)                           sends it what Jupyter would send:
                                                      killpg(SIGINT) for an interrupt,
                                                      SIGKILL for a kernel that dies

Every wait here is bounded (a child gives up after `seconds`), and every case kills what it
started before it returns: nothing in this module can hang the notebook or leave a process.
Workers live in a module, not in the notebook's cells: a spawned child imports its target by
name, and a function defined in a cell lives in ``__main__``, which the child does not have.
"""
import faulthandler
import logging
import logging.handlers
import os
import signal
import subprocess
import sys
import time

from .. import _proc

# --- 1. where a child's output goes ---------------------------------------------------------


def talk(tag):
    """Write one line four ways: print, sys.stderr, the raw fds 1 and 2 (what a C library does)."""
    print(f"{tag}: print()")
    sys.stderr.write(f"{tag}: sys.stderr.write()\n")
    os.write(1, f"{tag}: os.write(1, ...)\n".encode())
    os.write(2, f"{tag}: os.write(2, ...)\n".encode())
    sys.stdout.flush()


def talk_later(tag, delay):
    """print() after `delay` seconds: by then the cell that started this child has finished."""
    time.sleep(delay)
    print(f"{tag}: printed {delay:g} s after start", flush=True)


def talk_to_file(tag, path):
    """The dependable way: send stdout and stderr (the fds, so C code's output too) to a file."""
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    sys.stdout = open(1, "w", closefd=False)      # Python's streams on the new fds
    sys.stderr = open(2, "w", closefd=False)
    talk(tag)
    log_both(tag)
    sys.stdout.flush()
    sys.stderr.flush()


# --- 2. logging ------------------------------------------------------------------------------


def log_both(tag):
    """An INFO and a WARNING message through the root logger, as most code logs."""
    logging.info("%s: an INFO message", tag)
    logging.warning("%s: a WARNING message", tag)


def log_through_queue(queue, rank):
    """A worker that logs the right way: one QueueHandler, nothing else, on its root logger.
    The records travel (pickled) to the parent, whose QueueListener formats and writes them."""
    root = logging.getLogger()
    root.handlers[:] = [logging.handlers.QueueHandler(queue)]   # fork copied the parent's: drop
    root.setLevel(logging.INFO)
    for step in range(3):
        logging.getLogger("train").info("rank %d: step %d", rank, step)
    logging.getLogger("train").warning("rank %d: done", rank)


# --- 3. Ctrl-C: what an interrupt does to children -------------------------------------------


def wait_for_interrupt(path, seconds, ignore=False):
    """Wait up to `seconds`; write to `path` what ended the wait. `ignore`: ignore SIGINT, as a
    child started from a shell's background job (`cmd &`) does."""
    if ignore:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _note(path, f"ready {os.getpid()} pgid {os.getpgid(0)}")
    try:
        time.sleep(seconds)
        _note(path, f"timeout {os.getpid()}")
    except KeyboardInterrupt:
        _note(path, f"KeyboardInterrupt {os.getpid()}")
        raise


def _note(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def parent_main(path, methods, seconds, ignore=False, daemon=False, own_session=False,
                pdeathsig=False):
    """What the stand-in for a kernel runs: start one child per start method in `methods`, then
    wait for them. The child's options are the ones the notebook compares."""
    import multiprocessing as mp
    children = []
    for method in methods:
        target = orphan_candidate if (own_session or pdeathsig) else wait_for_interrupt
        args = ((path, seconds, own_session, pdeathsig) if target is orphan_candidate
                else (path, seconds, ignore))
        child = mp.get_context(method).Process(target=target, args=args, daemon=daemon,
                                               name=f"child-{method}")
        child.start()
        children.append(child)
    _note(path, f"parent {os.getpid()}")
    try:
        for child in children:
            child.join()
    except KeyboardInterrupt:
        _note(path, "parent KeyboardInterrupt")
        raise


def orphan_candidate(path, seconds, own_session, pdeathsig):
    if own_session:
        os.setsid()                       # leave the parent's process group and session
    if pdeathsig:
        # prctl(PR_SET_PDEATHSIG): Linux sends SIGTERM to this process when the thread that
        # started it ends; the very call mpviz.multiprocessing.spawn makes in each child
        from ..multiprocessing.spawn import _set_pdeathsig
        _set_pdeathsig(signal.SIGTERM)
    wait_for_interrupt(path, seconds)


def start_parent(path, methods=("fork", "spawn"), seconds=20.0, **options):
    """Start `parent_main` in a new session (as jupyter_client starts a kernel) and wait until
    its children are ready. Returns the Popen; `stop(popen, path)` cleans up."""
    open(path, "w").close()
    code = (f"from mpviz.examples.debugging import parent_main; "
            f"parent_main({str(path)!r}, {tuple(methods)!r}, {seconds!r}, **{options!r})")
    popen = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = read_notes(path)
        if sum(line.startswith("ready") for line in lines) == len(methods) and \
                any(line.startswith("parent") for line in lines):
            return popen
        if popen.poll() is not None:
            break
        time.sleep(0.05)
    stop(popen, path)
    raise RuntimeError(f"the stand-in parent did not start its children: {read_notes(path)}")


def read_notes(path):
    with open(path) as f:
        return f.read().splitlines()


def child_pids(path):
    """The pids of the children that wrote "ready" to `path`, in the order they wrote it --
    which is not always the order they were started in."""
    return [int(line.split()[1]) for line in read_notes(path) if line.startswith("ready")]


def child_groups(path):
    """{pid: its process group} of the children that wrote "ready" to `path`: one that left
    its parent's group with os.setsid() leads its own (pid == pgid)."""
    return {int(line.split()[1]): int(line.split()[3]) for line in read_notes(path)
            if line.startswith("ready") and len(line.split()) >= 4}


def is_running(pid):
    """True while `pid` exists and is not a zombie (a zombie has ended; it waits to be reaped)."""
    return _proc.alive(_proc.stat(pid))


def parent_of(pid):
    """The parent pid of `pid` (ps's PPID column), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def wait_until_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if is_running(p)]


def stop(popen, path):
    """Kill the stand-in parent, its group and every child it wrote down; reap the parent.
    Returns its output."""
    for pid in child_pids(path) if os.path.exists(path) else []:
        if is_running(pid):
            os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out, _ = popen.communicate(timeout=30)
    return out


def interrupt(popen, path, settle=3.0):
    """Do what Jupyter's interrupt does (jupyter_client's LocalProvisioner.send_signal):
    SIGINT to the kernel's whole process group. Then wait up to `settle` seconds for the
    parent to end and report what each process wrote down."""
    os.killpg(popen.pid, signal.SIGINT)
    try:
        popen.wait(timeout=settle)
    except subprocess.TimeoutExpired:
        pass
    wait_until_gone(child_pids(path), settle)
    return read_notes(path)


def orphan_case(path, daemon=False, own_session=False, pdeathsig=False, kill="parent",
                method="fork"):
    """Start the stand-in parent with one child, SIGKILL the parent alone (`kill="parent"`: the
    OOM killer, `kill -9 PID`) or its whole group (`kill="group"`: a Jupyter restart's last
    step), and say whether the child outlived it: {"parent", "child", "ppid_before", "alive",
    "ppid_after"}. "parent" is the stand-in's pid; "ppid_before" is the child's parent, the same
    pid but under forkserver (the fork server forks the child). The child is killed before this
    returns."""
    popen = start_parent(path, (method,), 20.0, daemon=daemon, own_session=own_session,
                         pdeathsig=pdeathsig)
    [child] = child_pids(path)
    before = parent_of(child)
    try:
        if kill == "group":
            os.killpg(popen.pid, signal.SIGKILL)
        else:
            os.kill(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)
        alive = bool(wait_until_gone([child], 1.0))     # still there after a second
        after = parent_of(child) if alive else None
    finally:
        stop(popen, path)
    return {"parent": popen.pid, "child": child, "ppid_before": before, "alive": alive,
            "ppid_after": after}


# --- 4. faulthandler: a stuck child's stack, on demand ----------------------------------------


def stuck_in_get(queue, path, seconds):
    """A child that waits for an item that never comes (bounded by `seconds`). SIGUSR1 makes it
    write every thread's stack to `path`; so does the watchdog armed below, after 1 s."""
    dump = open(path, "w")                     # faulthandler writes to a real fd: keep it open
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    faulthandler.dump_traceback_later(1.0, file=dump)    # once, unless cancelled
    wait_for_work(queue, seconds)


def ready_then_wait(ready, queue, seconds):
    """Say "ready" on `ready`, then wait for work on `queue` (up to `seconds`)."""
    ready.put(os.getpid())
    wait_for_work(queue, seconds)


def wait_for_work(queue, seconds):
    try:
        return queue.get(timeout=seconds)      # the line the stacks should point at
    except Exception:
        return None


def wait_for_dump(path, seconds, process=None):
    """The stacks faulthandler wrote to `path`, once it has written them (up to `seconds`, and
    no longer than `process`, the child that writes them, is alive)."""
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline and (process is None or process.is_alive()):
        text = open(path).read() if os.path.exists(path) else ""
        if text.rstrip().endswith("in <module>"):        # the outermost frame: the dump is whole
            return text
        time.sleep(0.05)
    raise TimeoutError(f"no stack dump in {path} after {seconds:g} s: {text[-300:]!r}")
