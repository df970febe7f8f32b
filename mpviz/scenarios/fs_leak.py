"""fs-leak: under file_system, a process killed by SIGKILL leaves its segments in /dev/shm.

What happens: a ``file_system`` segment is a named file in /dev/shm with a reference count in
its header. Each holder subtracts its 1 when it lets go, and whoever brings the count to 0
removes the name. A process killed by ``SIGKILL`` (the OOM killer, ``kill -9``, a crashed job
runner) runs no code at all: it never subtracts, so nobody ever reaches 0 and the file stays,
using RAM, until reboot. /dev/shm fills up (pitfall #11; on Docker's 64 MiB default, soon)::

    victim   create /dev/shm/mpviz_…  ─ SIGKILL ✗ (no cleanup runs)
    manager  (on)  the victim's connection closed → it held mpviz_… → unlink: gone
             (off) nobody knows → the file stays in /dev/shm

mpviz's shm manager is a small daemon every holder tells what it holds; when a holder's
connection closes, it unlinks what no live process holds. (torch's ``torch_shm_manager`` is
the same kind of daemon, but it waits until all its clients have exited, then unlinks what they
left: a killed worker's files stay while the rest of the job runs.) The fix is therefore: keep
the manager on (the default), prefer ``file_descriptor`` (nothing has a name, nothing can leak),
and never ``kill -9`` workers as a habit. ``manager=False`` switches it off to show the leak;
the scenario's cleanup then removes the file, as you would by hand.
"""
import os
import signal
import time

from .. import zeros
from ..trace import recorder
from ._common import check_between, context, get, start_method_param, step
from .base import Param

SUMMARY = "file_system + SIGKILL: segments left behind; the shm manager cleans them"
PARAMS = {
    "manager": Param(True, [True, False], "the shm manager on (cleans up) or off (the leak)"),
    "count": Param(3, None, "segments the victim creates before it is killed"),
    "watch_s": Param(2.0, None, "how long to watch /dev/shm after the kill"),
    "start_method": start_method_param("fork"),
}


def check_params(p):
    check_between(p, "count", 1, 50)
    check_between(p, "watch_s", 0.5, 10, " seconds")


def create_and_wait(out, count, kill_me):
    kept = [zeros(1024).share_memory_() for _ in range(count)]
    out.put([t.untyped_storage().segment_name for t in kept])
    kill_me.wait(20)                         # alive, holding them, until it is killed


def drive(p, details):
    import mpviz.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    mp.set_shm_manager(p["manager"])
    ctx = context(p)
    out, never = ctx.Queue(), ctx.Event()
    victim = ctx.Process(target=create_and_wait, args=(out, p["count"], never), name="victim")
    victim.start()
    names = get(out, what="the victim's segment names", sender=victim)
    details["segments"] = names
    details["in_dev_shm_before_kill"] = [n for n in names if os.path.exists("/dev/shm" + n)]
    step("SIGKILL the holder", pid=victim.pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    killed_at = time.monotonic()
    left = list(names)
    while left and time.monotonic() - killed_at < p["watch_s"]:
        time.sleep(0.05)                     # the lesson is about time: watch /dev/shm
        gone = [n for n in left if not os.path.exists("/dev/shm" + n)]
        if gone:
            step("segments gone from /dev/shm", names=gone,
                 after_s=round(time.monotonic() - killed_at, 2))
            for name in gone:  # the manager records nothing itself: say what we saw it do
                recorder.emit("shm.unlink", name=name, strategy="file_system", by="shm manager")
            left = [n for n in left if n not in gone]
    details["gone_after_s"] = None if left else round(time.monotonic() - killed_at, 2)
    details["left_after_watch"] = left
    step("still in /dev/shm after watching", names=left, watched_s=p["watch_s"])


def verdict(t, details):
    prm = details["params"]
    left = details.get("left_after_watch", [])
    removed = details.get("cleanup", {}).get("unlinked", [])
    if left:
        return "leak", (
            f"The victim created {len(details['segments'])} file_system segment(s) and was "
            f"killed with SIGKILL, so it never dropped its references. "
            + (f"With the shm manager off, {len(left)} file(s) were still in /dev/shm "
               f"{prm['watch_s']} s later (the memory map shows them with no live holder): "
               f"nobody would ever remove them before a reboot. " if not prm.get("manager") else
               f"The shm manager was on, yet {len(left)} file(s) were still in /dev/shm "
               f"{prm['watch_s']} s later: it did not remove them in time (a manager that "
               f"cannot see this /dev/shm, or a machine too loaded to answer). ")
            + f"The scenario's cleanup removed {len(removed)} by hand. Fix: keep the shm "
            f"manager on (the default), prefer the file_descriptor strategy, drain queues.")
    return "ok", (
        f"The victim was SIGKILLed holding {len(details['segments'])} file_system segment(s). "
        f"Its connection to the shm manager closed with it, and the manager unlinked what no "
        f"live process held: /dev/shm was clean {details.get('gone_after_s')} s after the kill. "
        f"Switch it off (manager=False) to see the leak it prevents.")
