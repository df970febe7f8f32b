"""A shared host: another user on the machine must not read, steer or hang your programs.

Each test plays both sides with real processes: the victim runs as this test's user, the
*other user* is a second, unprivileged uid (a child that drops to it with setuid/setgid, as
``su`` would: no account is created). Both meet where users meet on a real host: a directory
writable by everyone, like /tmp (here a fresh one per test, given to the victim as ``TMPDIR``
and as the shm manager's base, ``MPVIZ_SHM_MANAGER_DIR``, so that nothing outside it is
touched). Only root can become another user, so without root these tests skip and say why.

1. the shm manager's address: another user who takes it first learns nothing, and the victim
   gets a clear error instead of a hang;
2. spawn's error report: nothing another user plants is ever unpickled;
3. ``mpviz trace -o``: no planted link is followed, logs are private, nothing of the user's is
   overwritten;
4. ``mpviz shm`` run by another user says "not yours", never "GONE";
5. a manager started inside a traced program keeps none of the tracer's environment.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from mpviz.sharing import shm_manager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="becoming a second user needs root "
                                "(setuid); run as root, as CI does, to test a shared host")


def _free_uid():
    """A uid no account and no process uses (the other user exists only for this test)."""
    import pwd
    used = {int(p) for p in os.listdir("/proc") if p.isdigit()}
    owners = set()
    for pid in used:
        try:
            owners.add(os.stat(f"/proc/{pid}").st_uid)
        except OSError:
            pass
    for uid in range(61234, 62000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in owners:
                return uid
    pytest.skip("no free uid between 61234 and 62000")


@pytest.fixture
def host():
    """A /tmp-like directory (mode 1777) for this test, the other user's uid, and a cleanup
    that leaves no process of that user behind."""
    base = tempfile.mkdtemp(prefix="mpviz-host-", dir="/tmp")
    os.chmod(base, 0o1777)
    uid = _free_uid()
    yield base, uid
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(base, ignore_errors=True)


def _reachable(path):
    """Whether another user can reach `path`: every directory above it searchable by others."""
    path = os.path.realpath(path)
    while path != "/":
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


def _other_python():
    """A Python of this version that another user can run, and the path where it finds
    numpy: this one if reachable (a venv under a private home is not), else the system's."""
    import site
    import sysconfig
    # where this Python installs packages (sysconfig: a venv's lib/pythonX.Y/site-packages),
    # and site's list, which names folders that need not exist (Debian's .../local/lib/...)
    found = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib"),
             *site.getsitepackages()]
    packages = [p for p in dict.fromkeys(found)
                if os.path.isdir(p) and _reachable(os.path.join(p, "x"))]
    system = "/usr/bin/python{}.{}".format(*sys.version_info[:2])
    for python in (os.path.realpath(PY), system):
        if os.path.exists(python) and _reachable(python) and packages:
            return python, os.pathsep.join([ROOT] + packages)
    pytest.skip("no Python (with numpy) that another user can run: this one lives under a "
                "private directory and there is no system Python of the same version")


def other_popen(uid, code, *args, env=None):
    """Start ``python -c code args...`` as the other user (uid = gid = `uid`, no supplementary
    groups), with this checkout and numpy importable."""
    python, path = _other_python()
    env = dict(env or {}, PYTHONPATH=path, HOME="/nonexistent", PATH=os.environ["PATH"])
    return subprocess.Popen([python, "-c", textwrap.dedent(code), *args], env=env, user=uid,
                            group=uid, extra_groups=[], cwd="/", text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def as_other(uid, code, env=None, timeout=30):
    """``other_popen``, waited for: the CompletedProcess."""
    p = other_popen(uid, code, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def as_me(code, env, timeout=30, **kw):
    """Run ``python -c code`` as this test's user (the victim)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
               **env)
    return subprocess.run([PY, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout, **kw)


def _wait_for(path, seconds=20):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear in {seconds} s"
        time.sleep(0.02)       # polling a file the other process makes, bounded


def _names(tag):
    return [n for n in os.listdir("/dev/shm") if n.startswith("mpviz_" + tag)]


# -- 1. the shm manager's address ------------------------------------------------------------

SQUAT = """
    import os, socket, sys, time, select
    base, victim, sockname, abstract, how = sys.argv[1:]
    home = os.path.join(base, f"mpviz-{victim}")           # where the victim's manager lives
    if how == "directory":
        os.mkdir(home); os.chmod(home, 0o777)
    else:                                                   # a link to a directory of ours
        mine = os.path.join(base, "mine"); os.mkdir(mine); os.chmod(mine, 0o777)
        os.symlink(mine, home)
    listeners = []
    for address in (os.path.join(home, sockname), "\\0" + abstract):
        s = socket.socket(socket.AF_UNIX); s.bind(address); s.listen(512); listeners.append(s)
    open(os.path.join(base, "squatting"), "w").close()
    heard, conns, deadline = b"", [], time.monotonic() + 20
    while time.monotonic() < deadline and not os.path.exists(os.path.join(base, "stop")):
        ready = select.select(listeners + conns, [], [], 0.05)[0]
        for r in ready:
            if r in listeners:
                conns.append(r.accept()[0])
            else:
                heard += r.recv(65536)
    print(repr(heard))
"""


@pytest.mark.parametrize("how", ["directory", "symlink"])
def test_another_user_who_takes_the_managers_address_first_hears_nothing(host, how):
    base, other = host
    tag = f"sq{os.getpid()}_"
    digest = hashlib.sha1(tag.encode()).hexdigest()[:12]
    dev = f"-d{os.stat('/dev/shm').st_dev:x}"
    sockname = f"shm-manager-{digest}{dev}-v{shm_manager.PROTOCOL}.sock"
    abstract = f"mpviz-shm-manager-{os.getuid()}-{digest}{dev}-v{shm_manager.PROTOCOL}"
    squatter = other_popen(other, SQUAT, base, str(os.getuid()), sockname, abstract, how)
    try:
        _wait_for(os.path.join(base, "squatting"))
        # The victim: a program that shares 300 tensors by file_system (~280 filled the
        # squatter's socket buffer and hung it before).
        victim = as_me("""
            import mpviz, mpviz.multiprocessing as mp
            mp.set_sharing_strategy("file_system")
            kept = [mpviz.zeros(4).share_memory_() for _ in range(300)]
            print("shared", len(kept))
        """, {"MPVIZ_SHM_TAG": tag, "MPVIZ_SHM_MANAGER_DIR": base, "TMPDIR": base})
    finally:
        open(os.path.join(base, "stop"), "w").close()
        heard, _ = squatter.communicate(timeout=30)
    assert heard.strip() == "b''", f"the other user heard: {heard[:300]}"
    assert victim.returncode != 0 and "ManagerUnsafe" in victim.stderr, victim.stderr[-2000:]
    assert f"mpviz-{os.getuid()}" in victim.stderr and "another user" in victim.stderr
    assert "Fix:" in victim.stderr
    assert not _names(tag)


# -- 2. spawn's error report -----------------------------------------------------------------

PLANT = """
    import ctypes, os, pickle, select, struct, sys
    base = sys.argv[1]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init()
    IN_CREATE, IN_DELETE = 0x100, 0x200
    libc.inotify_add_watch(fd, base.encode(), IN_CREATE | IN_DELETE)
    open(os.path.join(base, "watching"), "w").close()
    created, planted = set(), []
    class Payload:                         # what the victim's unpickling would run
        def __reduce__(self):
            return os.mkdir, (os.path.join(base, "PWNED"),)
    while not planted:
        if not select.select([fd], [], [], 20)[0]:
            break
        data = os.read(fd, 65536)
        while data:
            wd, mask, cookie, size = struct.unpack_from("iIII", data)
            name = data[16:16 + size].rstrip(b"\\0").decode()
            data = data[16 + size:]
            if mask & IN_CREATE and name.startswith("mpviz-errorfile-"):
                created.add(name)
            elif mask & IN_DELETE and name in created:     # free again: plant a pickle there
                with open(os.path.join(base, name), "wb") as f:
                    pickle.dump(Payload(), f)
                os.chmod(os.path.join(base, name), 0o666)
                planted.append(name)
            elif mask & IN_CREATE and name == "started":
                break
        if os.path.exists(os.path.join(base, "started")):
            break
    print("planted", planted)
    open(os.path.join(base, "go"), "w").close()
"""


def test_a_pickle_another_user_plants_is_never_loaded_by_spawn(host):
    base, other = host
    planter = other_popen(other, PLANT, base)
    try:
        _wait_for(os.path.join(base, "watching"))
        victim = as_me(f"""
            import mpviz.multiprocessing as mp
            import shared_host_workers as w
            if __name__ == "__main__":
                try:
                    mp.spawn(w.exit_when_told, args=({base!r},), nprocs=1)
                except mp.ProcessExitedException as exc:
                    print("EXITED", exc)
        """, {"TMPDIR": base}, timeout=60)
    finally:
        out, err = planter.communicate(timeout=30)
    assert not os.path.exists(os.path.join(base, "PWNED")), \
        f"the victim ran the other user's pickle (planted {out.strip()})"
    assert "EXITED process 0 terminated with exit code 2" in victim.stdout, \
        victim.stdout + victim.stderr[-2000:]


# -- 3. mpviz trace -o DIR -------------------------------------------------------------------

def _trace(out, *program, timeout=60):
    return subprocess.run([PY, "-m", "mpviz", "trace", "--no-plot", "--hang-after", "0",
                           "-o", out, "--", *program], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd="/tmp")


def test_trace_output_follows_no_link_another_user_planted(host):
    base, other = host
    secret_dir = os.path.join(base, "victims")
    os.mkdir(secret_dir, 0o700)
    secret = os.path.join(secret_dir, "only-mine.txt")
    with open(secret, "w") as f:
        f.write("precious\n")
    out = os.path.join(base, "trace")
    as_other(other, f"""
        import os
        os.mkdir({out!r}); os.chmod({out!r}, 0o777)     # made first, open to the victim
        os.symlink({secret!r}, os.path.join({out!r}, "trace.json"))
    """).check_returncode()
    run = _trace(out, PY, "-c", "pass")
    with open(secret) as f:
        assert f.read() == "precious\n", "the trace was written through the planted link"
    assert run.returncode == 2 and f"belongs to uid {other}" in run.stderr, run.stderr


def test_finish_refuses_a_directory_of_another_user(host):
    base, other = host
    planted = os.path.join(base, "theirs")
    as_other(other, f"""
        import os
        os.mkdir({planted!r}); os.chmod({planted!r}, 0o755)
        open(os.path.join({planted!r}, "1234-0.mpvlog"), "wb").close()   # a log of their making
    """).check_returncode()
    run = subprocess.run([PY, "-m", "mpviz", "trace", "--finish", planted, "--no-plot"],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                         timeout=60)
    assert run.returncode == 2 and f"belongs to uid {other}" in run.stderr, run.stderr
    assert os.listdir(planted) == ["1234-0.mpvlog"]


def test_trace_logs_are_private_and_the_other_user_cannot_read_them(host):
    base, other = host
    out = os.path.join(base, "trace")
    run = _trace(out, PY, "-c", "import sys; print(sys.argv)")
    assert run.returncode == 0, run.stderr
    assert os.stat(out).st_mode & 0o777 == 0o700
    files = os.listdir(out)
    assert any(f.endswith(".mpvlog") for f in files) and "trace.json" in files
    for f in files:
        assert os.stat(os.path.join(out, f)).st_mode & 0o077 == 0, f"{f} is readable by others"
    peek = as_other(other, f"""
        import os
        for f in {files!r}:
            try:
                open(os.path.join({out!r}, f), "rb").read(1)
                print("READ", f)
            except OSError:
                pass
    """)
    assert "READ" not in peek.stdout, peek.stdout


def test_trace_never_overwrites_a_file_it_did_not_write(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "trace.json").write_text("my own notes\n")
    run = _trace(str(out), PY, "-c", "pass")
    assert run.returncode == 2 and "trace.json" in run.stderr and "Fix:" in run.stderr, run.stderr
    assert (out / "trace.json").read_text() == "my own notes\n"


def test_the_report_a_ctrl_c_leaves_is_private_like_every_other_trace_file(tmp_path):
    # The user's own -o directory, readable by others (mode 755, as mkdir makes it): what mpviz
    # writes there must still be 0600 -- the Ctrl-C report names processes, argv and stacks.
    out = tmp_path / "mine"
    out.mkdir()
    out.chmod(0o755)
    launcher = subprocess.Popen(
        [PY, "-m", "mpviz", "trace", "--no-plot", "--hang-after", "0", "-o", str(out), "--",
         PY, os.path.join(ROOT, "tests", "exit_programs", "wait_for_file.py"),
         str(tmp_path / "never-written.txt")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert launcher.stdout.readline().strip() == "waiting for the reader"
        os.killpg(launcher.pid, signal.SIGINT)          # a terminal's Ctrl-C
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    verdict = out / "verdict.txt"
    assert "INTERRUPTED (Ctrl-C)" in verdict.read_text(), err
    for f in out.iterdir():
        assert f.stat().st_mode & 0o077 == 0, f"{f.name} is readable by others"


def test_finish_run_again_writes_a_new_file_beside_the_trace_never_over_it(tmp_path):
    out = tmp_path / "t"
    assert _trace(str(out), PY, "-c", "pass").returncode == 0
    first = (out / "trace.json").read_bytes()
    again = subprocess.run([PY, "-m", "mpviz", "trace", "--finish", str(out), "--no-plot"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                           timeout=60)
    assert again.returncode == 0, again.stderr
    assert (out / "trace.json").read_bytes() == first
    assert f"wrote {out / 'trace-2.json'}" in again.stderr and (out / "trace-2.json").exists()
    # the trace.json left alone is this recording's own (the launcher wrote it): never called
    # another run's
    assert "not this run's" not in again.stderr, again.stderr


def test_a_dangling_output_link_is_named_with_its_target(tmp_path):
    (tmp_path / "out").symlink_to(tmp_path / "nowhere" / "trace")
    run = _trace(str(tmp_path / "out"), PY, "-c", "pass")
    assert run.returncode == 2, run.stderr
    assert "symbolic link" in run.stderr and "nowhere/trace" in run.stderr, run.stderr
    assert "does not exist" in run.stderr and "Fix: create it first" in run.stderr
    assert "File exists" not in run.stderr


# -- 4. mpviz shm, run by another user -------------------------------------------------------

@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)  # (restored afterwards)
def test_mpviz_shm_calls_another_users_segments_not_yours_never_gone(host, strategy):
    base, other = host
    import mpviz
    t = mpviz.zeros(16).share_memory_()
    name = t.untyped_storage().segment_name.lstrip("/")
    run = as_other(other, "from mpviz.cli import main; raise SystemExit(main(['shm']))",
                   env={"MPVIZ_SHM_TAG": os.environ["MPVIZ_SHM_TAG"],
                        "MPVIZ_SHM_MANAGER_DIR": base})
    del t
    assert run.returncode == 0, run.stderr
    assert "GONE" not in run.stdout, run.stdout
    assert name not in run.stdout and "not yours" in run.stdout, run.stdout


# -- 5. a manager started inside a traced program --------------------------------------------

def _manager_pids(tag):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"--serve" not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"MPVIZ_SHM_TAG={tag}".encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_manager_started_in_a_traced_program_keeps_none_of_the_tracer(host):
    base, other = host
    tag = f"tr{os.getpid()}_"
    out = os.path.join(base, "trace")
    program = f"""
        import os, time
        import mpviz, mpviz.multiprocessing as mp
        mp.set_sharing_strategy("file_system")
        t = mpviz.zeros(4).share_memory_()                  # starts the shm manager
        open({os.path.join(base, 'ready')!r}, "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists({os.path.join(base, 'done')!r}) and time.monotonic() < deadline:
            time.sleep(0.02)
    """
    tracer = other_popen(other, f"""
        import sys
        from mpviz.cli import main
        raise SystemExit(main(["trace", "--no-plot", "-o", {out!r}, "--",
                               sys.executable, "-c", {textwrap.dedent(program)!r}]))
    """, env={"MPVIZ_SHM_TAG": tag, "MPVIZ_SHM_MANAGER_DIR": base})
    try:
        _wait_for(os.path.join(base, "ready"), 30)
        (manager,) = _manager_pids(tag)
        with open(f"/proc/{manager}/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        held = [os.readlink(f"/proc/{manager}/fd/{fd}") for fd in os.listdir(f"/proc/{manager}/fd")]
    finally:
        open(os.path.join(base, "done"), "w").close()
        stdout, stderr = tracer.communicate(timeout=60)
    assert tracer.returncode == 0, stderr
    assert b"MPVIZ_TRACE_DIR" not in env and b"autostart" not in env.get(b"PYTHONPATH", b""), env
    assert not [h for h in held if h.startswith(out)], held
    logs = [f for f in os.listdir(out) if f.startswith(f"{manager}-")]
    assert not logs, f"the manager recorded into the trace: {logs}"
    deadline = time.monotonic() + 10                       # it exits once idle, as always
    while _manager_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _manager_pids(tag) and not _names(tag)
