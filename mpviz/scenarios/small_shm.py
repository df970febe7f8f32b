"""small-shm: DataLoader-shaped workers fill a container's small /dev/shm.

What happens: a DataLoader with ``num_workers=W`` keeps ``W x prefetch_factor`` batches in
flight, and each batch a worker hands over lives in shared memory -- in ``/dev/shm``, under both
sharing strategies -- until the training loop lets go of it. Docker gives a container a 64 MiB
``/dev/shm`` (Binder too), so a few workers with large batches run out (pitfall #2)::

    /dev/shm: 64 MiB tmpfs
    worker 0  batch 0 (8 MiB) ▇  batch 1 ▇
    worker 1  batch 0 ▇          batch 1 ▇           in flight: 4 workers x 2 batches x 8 MiB
    worker 2  ...                                       = 64 MiB + headers > 64 MiB
    worker 3  batch 0 ▇          batch 1 ✗ No space left on device

What torch says: 2.13 reserves the pages when it creates the segment and fails there with
``RuntimeError: unable to allocate shared memory(shm) for file </torch_...>: No space left on
device (28)``, which DataLoader re-raises in the main process ("Caught RuntimeError in
DataLoader worker process 3"). Older versions failed later, at the first write to a page that
was not there: ``DataLoader worker (pid N) is killed by signal: Bus error``. mpviz reserves the
pages too (the write of the tensor's bytes allocates every page; with nothing to write,
``posix_fallocate`` does) and raises ``SharedMemoryFullError``.

The fix: give the container more (``docker run --shm-size=2g`` or ``--ipc=host``; here
``shm_mb=128``), or keep less in flight: fewer workers (``workers=2``), smaller batches
(``batch_mb=4``) or a smaller ``prefetch_factor``.
"""
import json
import os
import subprocess
import sys

from ._common import check_between, headline, step
from .base import Param

SUMMARY = "DataLoader-shaped workers fill a 64 MiB /dev/shm (Docker's default)"
PARAMS = {
    "workers": Param(4, None, "loader workers (DataLoader's num_workers)"),
    "batch_mb": Param(8, None, "MiB per batch"),
    "prefetch": Param(2, None, "batches each worker keeps in flight (DataLoader's "
                               "prefetch_factor)"),
    "shm_mb": Param(64, None, "size of /dev/shm in MiB (Docker's default: 64; --shm-size)"),
    "shm": Param("auto", ["auto", "tmpfs", "cap"],
                 "tmpfs: a real tmpfs of shm_mb in a private mount namespace (root only); cap: "
                 "the workers enforce shm_mb themselves; auto: tmpfs where it can be made"),
}
STALL_SECONDS = 5.0


def check_params(p):
    check_between(p, "workers", 1, 8)
    check_between(p, "batch_mb", 1, 32, " (MiB)")
    check_between(p, "prefetch", 1, 4)
    check_between(p, "shm_mb", 16, 256, " (MiB)")


# -- the loader: runs inside the small /dev/shm (or under the cap) ---------------------------------

def loader_worker(wid, p, q, done, used, cap):
    """One DataLoader worker: make `prefetch` batches in shared memory and hand them over."""
    import mpviz
    from ..errors import SharedMemoryFullError
    nbytes = p["batch_mb"] << 20
    for i in range(p["prefetch"]):
        counted = 0
        try:
            if cap is not None:
                counted = _count_against_cap(used, cap, nbytes)
            batch = mpviz.empty(nbytes // 4)      # float32: batch_mb MiB
            batch.share_memory_()                 # where DataLoader's collate puts a batch
            batch.fill_(wid)
            q.put(("batch", wid, batch))
            del batch
        except SharedMemoryFullError as exc:
            if counted:                           # the real /dev/shm was full before the cap
                with used.get_lock():
                    used.value -= counted
            step("/dev/shm is full: no room for the next batch", worker=wid, batch=i)
            q.put(("error", wid, f"{type(exc).__name__}: {exc}"))
            break
    q.put(("end", wid, None))
    done.wait(30)             # file_descriptor: a live sender hands over the descriptors


def _count_against_cap(used, cap, nbytes):
    """The fallback: the run's shared bytes so far + this batch must fit in `cap`, counted as
    tmpfs counts them: the segment's header included, in whole pages. Returns what it counted."""
    from ..errors import SharedMemoryFullError
    from ..sharing.segment import HEADER
    page = os.sysconf("SC_PAGE_SIZE")
    size = -(-(HEADER + nbytes) // page) * page
    with used.get_lock():
        if used.value + size > cap:
            raise SharedMemoryFullError(
                HEADER + nbytes, "file_descriptor",
                f"mpviz's cap of {cap >> 20} MiB for this run: {used.value >> 20} MiB in use")
        used.value += size
    return size


def load(p, cap=None):
    """The main process of the loader: start the workers, hold every batch in flight at once
    (the prefetch window), note how full /dev/shm is, then let go. Returns what it saw."""
    import mpviz.multiprocessing as mp
    mp.set_sharing_strategy("file_descriptor")
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    q, done = ctx.Queue(), ctx.Event()
    used = ctx.Value("q", 0) if cap is not None else None
    workers = [ctx.Process(target=loader_worker, args=(i, p, q, done, used, cap),
                           name=f"loader-worker-{i}") for i in range(p["workers"])]
    for w in workers:
        w.start()
    batches, errors, ended = [], [], 0
    while ended < len(workers):
        kind, wid, payload = q.get(timeout=20)
        if kind == "batch":
            batches.append(payload)
        elif kind == "error":
            errors.append(payload)
        else:
            ended += 1
    st = os.statvfs("/dev/shm")                 # our own tmpfs: all of its use is ours
    seen = {"batches": len(batches), "errors": errors, "shm_size": st.f_blocks * st.f_frsize,
            "shm_used_at_peak": used.value if cap is not None else
            (st.f_blocks - st.f_bavail) * st.f_frsize}
    step("main process holds every batch in flight", batches=len(batches), errors=len(errors))
    del batches
    done.set()
    for w in workers:
        w.join(20)
    return seen


# -- the driver: a private 64 MiB /dev/shm if it can make one, the cap otherwise -------------------

def _can_make_tmpfs():
    if os.geteuid() != 0:
        return False, "not root: mounting a tmpfs needs CAP_SYS_ADMIN"
    try:          # the whole recipe, on a 1 MiB tmpfs that vanishes with the probe
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "mount",
                                "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/dev/shm"],
                               capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare is not usable here ({exc})"
    if probe.returncode != 0:
        return False, (f"a tmpfs could not be mounted in a new mount namespace: "
                       f"{probe.stderr.decode(errors='replace').strip()}")
    return True, ""


def _load_in_private_tmpfs(p):
    """Run ``load`` in a new mount namespace whose /dev/shm is a fresh tmpfs of shm_mb MiB.
    Recorded into this run's trace like any child (mpviz's autostart, as run_program does)."""
    from ..trace import autostart, recorder
    env = dict(os.environ)
    env[autostart.ENV_DIR] = recorder.current_directory()
    path = [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
    env["PYTHONPATH"] = os.pathsep.join([autostart.site_directory()] + path)
    mount = 'mount -t tmpfs -o "size=$1,mode=1777" tmpfs /dev/shm || exit 97; shift; exec "$@"'
    cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh",
           f"{p['shm_mb']}m", sys.executable, "-m", __name__, json.dumps(p)]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True, timeout=40)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 97 or not lines:
        raise RuntimeError(f"the loader in a private /dev/shm printed no result (exit status "
                           f"{done.returncode}); its output: {done.stdout[-1000:]!r}")
    return json.loads(lines[-1])


def drive(p, details):
    """Where the 64 MiB comes from (``shm`` parameter): as root, the case runs its loader in a
    private mount namespace (``unshare --mount``) with a real 64 MiB tmpfs mounted on ``/dev/shm``
    -- the real kernel says ENOSPC; nothing outside the namespace sees that mount, and it
    disappears with its last process. Where that cannot be done (not root, no ``unshare``), the
    workers count the bytes they share against a cap of the same size and raise the same error
    themselves; the verdict says which one ran."""
    possible, why_not = _can_make_tmpfs() if p["shm"] != "cap" else (False, "")
    if p["shm"] == "tmpfs" and not possible:
        raise RuntimeError(f"shm='tmpfs' cannot run here: {why_not}; use shm='cap' or 'auto'")
    details["where"] = "tmpfs" if possible else "cap"
    details["why_cap"] = why_not
    step("start the loader", where=details["where"], shm_mb=p["shm_mb"])
    if possible:
        details.update(_load_in_private_tmpfs(p))
    else:
        details.update(load(p, cap=p["shm_mb"] << 20))


def _raced(details, prm):
    """Why fewer batches fitted than the room holds one at a time, if so: the last ones were
    written at the same moment (each write takes pages as it goes, so two can share out the
    last free room and both fail). Only a real tmpfs does that; the cap counts under a lock."""
    from ..sharing.segment import HEADER
    page = os.sysconf("SC_PAGE_SIZE")
    fits = details["shm_size"] // (-(-(HEADER + (prm["batch_mb"] << 20)) // page) * page)
    if details["where"] != "tmpfs" or len(details["errors"]) < 2 or details["batches"] >= fits:
        return ""
    return (f"Room for {fits} when they come one at a time, but {len(details['errors'])} "
            f"workers were writing their batches into the last free room at the same moment: "
            f"each took part of it, so none of them fitted. ")


def verdict(t, details):
    prm = details["params"]
    wanted = prm["workers"] * prm["prefetch"] * prm["batch_mb"]
    if details["where"] == "tmpfs":
        where = (f"in a private mount namespace whose /dev/shm was a real {prm['shm_mb']} MiB "
                 f"tmpfs")
    else:
        where = (f"against a {prm['shm_mb']} MiB cap that mpviz's workers enforced themselves, "
                 f"counting whole pages as tmpfs does"
                 + (f" (a real small tmpfs could not be made here: {details['why_cap']})"
                    if details["why_cap"] else " (shm='cap')"))
    in_flight = (f"{prm['workers']} workers x {prm['prefetch']} batch"
                 f"{'es' if prm['prefetch'] > 1 else ''} x {prm['batch_mb']} MiB "
                 f"= {wanted} MiB in flight")
    peak = f"{details['shm_used_at_peak'] >> 20} MiB " + (
        "of /dev/shm in use" if details["where"] == "tmpfs" else "counted against the cap")
    real_enospc = details["errors"] and "mpviz's cap" not in details["errors"][0]
    if details["where"] == "cap" and real_enospc:
        # a machine whose own /dev/shm is small (a real container) may fill before the cap
        where = (f"against this machine's own /dev/shm ({details['shm_size'] >> 20} MiB), which "
                 f"filled before mpviz's {prm['shm_mb']} MiB cap did")
    if details["errors"]:
        return "error", (
            f"Run {where}: {in_flight}, plus a small header per segment. {details['batches']} "
            f"batches fitted ({peak}), then a worker could not create the "
            f"next one" + (" (the kernel said ENOSPC)" if details["where"] == "tmpfs" else "") +
            f": {headline(details['errors'][0])} " + _raced(details, prm) +
            f"torch 2.13 fails the same way, when a worker "
            f"creates the segment: 'unable to allocate shared memory(shm) ... No space left on "
            f"device (28)' (older versions: 'DataLoader worker (pid N) is killed by signal: "
            f"Bus error'). "
            f"Fix: more /dev/shm (docker run --shm-size=2g or --ipc=host; shm_mb=128), fewer "
            f"workers (workers=2), smaller batches (batch_mb=4) or a smaller prefetch_factor.")
    return "ok", (f"Run {where}: {in_flight} fitted; all {details['batches']} batches were in "
                  f"flight at once ({peak}).")


if __name__ == "__main__":
    # the loader's own program, run by _load_in_private_tmpfs inside the new namespace
    print(json.dumps(load(json.loads(sys.argv[1]))))
