"""A memory limit for a group of processes (a memory cgroup), and their memory as /proc counts it.

A container or a job scheduler limits a job's memory with a *memory cgroup*: a directory under
/sys/fs/cgroup whose processes the kernel charges for every page they touch. Past the limit its
OOM killer SIGKILLs the process of the group that uses the most memory::

    make_cgroup(256 << 20)  ->  /sys/fs/cgroup/memory/.../mpviz-oom-PID  (v1: memory.limit_in_bytes)
                                /sys/fs/cgroup/.../mpviz-oom-PID         (v2: memory.max)
    a worker writes its pid to  <dir>/cgroup.procs: from then on its new pages are charged there
    oom_kills(dir, version)     how many the kernel killed there; charged(dir, version): bytes now
    remove_cgroup(dir)          rmdir once its processes are gone

Making one needs root and a mounted memory controller; ``make_cgroup`` raises OSError saying why
not. Where it cannot, :func:`play_oom_killer` stands in: the caller samples the processes and it
SIGKILLs the largest once their growth passes the limit -- a stand-in its callers must name as one.

What a process uses (:func:`memory`): VmRSS counts every page mapped in, shared ones too (a
forked child starts with its parent's whole RSS); USS, the private pages (Private_Clean +
Private_Dirty of /proc/PID/smaps_rollup), counts what is this process's alone: what copy-on-write
has copied. Used by the oom-killed scenario and notebook 13 (mpviz/examples/dataloader_watch.py).
"""
import os
import signal
import time

PREFIX = "mpviz-oom-"


def memory_cgroup_dir():
    """(directory of this process's memory cgroup, 'v1' or 'v2'), or (None, why not)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return None, f"no /proc/self/cgroup ({exc})"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = "/sys/fs/cgroup/memory"
            if os.path.isdir(base + path):
                return base + path, "v1"
    for line in lines:
        if line.startswith("0::"):
            base = "/sys/fs/cgroup" + line[3:]
            try:
                with open(os.path.join(base, "cgroup.controllers")) as f:
                    if "memory" in f.read().split():
                        return base, "v2"
            except OSError:
                pass
    return None, "no memory cgroup controller is mounted (v1 or v2)"


def make_cgroup(limit_bytes):
    """Create a memory cgroup limited to `limit_bytes` (no swap); return (dir, version) or raise
    OSError saying why it cannot be made here."""
    parent, version = memory_cgroup_dir()
    if parent is None:
        raise OSError(version)
    _remove_stale(parent)
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}")
    os.mkdir(path)                    # OSError (EACCES, EROFS...) when we may not
    try:
        if version == "v1":
            _write(path, "memory.limit_in_bytes", limit_bytes)
            _write(path, "memory.memsw.limit_in_bytes", limit_bytes, optional=True)   # no swap
        else:
            _write(path, "memory.max", limit_bytes)
            _write(path, "memory.swap.max", 0, optional=True)
    except OSError:
        os.rmdir(path)
        raise
    return path, version


def oom_kills(path, version):
    """How many processes the kernel's OOM killer killed in this cgroup (None: cannot say)."""
    name = "memory.oom_control" if version == "v1" else "memory.events"
    try:
        with open(os.path.join(path, name)) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
    except OSError:
        pass
    return None


def charged(path, version):
    """Bytes the kernel charges to this cgroup now (None once it is gone)."""
    name = "memory.usage_in_bytes" if version == "v1" else "memory.current"
    try:
        with open(os.path.join(path, name)) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def remove_cgroup(path):
    """rmdir the cgroup once its processes are gone (bounded wait: they may be exiting)."""
    deadline = time.monotonic() + 3
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)     # a killed worker leaves the cgroup as it exits; bounded


def _remove_stale(parent):
    """Remove cgroups of earlier runs whose driver is gone (a run the watchdog had to kill)."""
    for entry in os.listdir(parent):
        pid = entry[len(PREFIX):]
        if entry.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                os.rmdir(os.path.join(parent, entry))
            except OSError:
                pass


def _write(path, name, value, optional=False):
    try:
        with open(os.path.join(path, name), "w") as f:
            f.write(str(value))
    except OSError:
        if not optional:
            raise


def play_oom_killer(now, base, limit):
    """No cgroup: given {pid: bytes now} (None: gone) and {pid: bytes when it joined}, SIGKILL
    the largest once their growth since joining passes `limit`; return its pid (else None)."""
    alive = {k: v for k, v in now.items() if v is not None}
    grown = sum(v - base.get(k, v) for k, v in alive.items())
    if not alive or grown <= limit:
        return None
    victim = max(alive, key=alive.get)
    os.kill(victim, signal.SIGKILL)
    return victim


# -- what a process uses ------------------------------------------------------------------------

def rss(pid):
    """Resident memory of `pid` in bytes (VmRSS), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def memory(pid):
    """(RSS, USS) of `pid` in bytes from /proc/PID/smaps_rollup (USS: its private pages, clean
    and dirty), or None once it is gone (or on a kernel before 4.14, without smaps_rollup)."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if value.rstrip().endswith("kB"):
                    fields[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    if "Rss" not in fields:
        return None
    return fields["Rss"], fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
