"""The shm manager holds under bad clients and faults (same user; another user: test_shared_host).

Each test has a manager of its own (its own ``MPVIZ_SHM_TAG``, under this run's tag so that the
leak check sees its names), real holders in processes of their own session, and a "bad client":
a raw socket that sends what no mpviz client would. The proof that the manager still works is
always the same: a holder is SIGKILLed, and its names must leave /dev/shm within seconds.
"""
import itertools
import json
import os
import pathlib
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from mpviz import _proc
from mpviz.sharing import shm_manager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_count = itertools.count()

HOLDER = """
    import json, sys
    import mpviz, mpviz.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    kept = [mpviz.zeros(4).share_memory_() for _ in range(int(sys.argv[1]))]
    print(json.dumps([t.untyped_storage().segment_name for t in kept]), flush=True)
    sys.stdin.read()                          # held until the test closes our stdin (or kills us)
"""


@pytest.fixture
def tag():
    """A tag (and so a manager) of this test's own; names left at the end are removed."""
    tag = f"{os.environ['MPVIZ_SHM_TAG']}f{next(_count)}_"
    yield tag
    for name in _names(tag):
        os.unlink("/dev/shm/" + name)


def _names(tag):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("mpviz_" + tag))


def holder(tag, n, limits=None):
    """A process (in a session of its own) holding `n` file_system segments: (Popen, names)."""
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(n)],
                         env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lower if limits else None)
    return p, json.loads(p.stdout.readline())


def kill(p):
    p.kill()
    p.wait()
    p.stdin.close()
    p.stdout.close()


def gone_within(tag, seconds):
    """Whether every name of `tag` left /dev/shm within `seconds` (polled: the manager works
    asynchronously)."""
    deadline = time.monotonic() + seconds
    while _names(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def names_gone_within(tag, names, seconds):
    """Whether `names` (of `tag`) all left /dev/shm within `seconds`."""
    deadline = time.monotonic() + seconds
    while {"/" + n for n in _names(tag)} & set(names):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def address(tag):
    old = os.environ["MPVIZ_SHM_TAG"]
    os.environ["MPVIZ_SHM_TAG"] = tag
    try:
        return shm_manager.address()
    finally:
        os.environ["MPVIZ_SHM_TAG"] = old


def raw_client(tag):
    """A connection to `tag`'s manager that speaks no mpviz (it must be running)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(address(tag))
    return s


def ask(s, name):
    """FATE `name` on connection `s`: the manager answers after it has read all that `s` sent
    before, so this also waits until it has."""
    s.sendall(f"FATE {name}\n".encode())
    s.settimeout(10)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = s.recv(256)
        assert chunk, "the manager closed the connection"
        answer += chunk
    return answer.decode().split()


def manager_pid(tag):
    s = raw_client(tag)
    pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    s.close()
    return pid


def test_a_line_that_is_not_utf8_is_skipped_and_the_manager_goes_on(tag):
    p, names = holder(tag, 5)
    bad = raw_client(tag)
    bad.sendall(b"\xff\xfe\xfd\n" + b"HOLD /mpviz_\xff\xfe 1\n")
    assert ask(bad, names[0])[0] == "held"       # (old: the manager died on the first line)
    bad.close()
    kill(p)
    assert gone_within(tag, 10), f"{len(_names(tag))} of 5 names left after the holder died"


def test_an_unlinked_claim_for_a_name_that_still_exists_is_not_believed(tag):
    p, names = holder(tag, 1)
    liar = raw_client(tag)
    liar.sendall(f"UNLINKED {names[0]}\n".encode())
    ask(liar, names[0])                          # it has read the lie
    liar.close()
    kill(p)
    assert gone_within(tag, 10), "the manager believed the lie and forgot the name"


def test_a_40_mb_line_does_not_grow_the_manager(tag):
    p, names = holder(tag, 1)
    manager = manager_pid(tag)

    def peak():
        with open(f"/proc/{manager}/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) // 1024

    before = peak()
    flood = raw_client(tag)
    flood.sendall(b"H" * (40 << 20))             # one line, never ended
    flood.sendall(b"\n")
    assert ask(flood, names[0])[0] == "held"
    grew = peak() - before
    flood.close()
    kill(p)
    assert grew < 8, f"the manager's peak memory grew by {grew} MiB for one 40 MB line"
    assert gone_within(tag, 10)


def test_past_its_soft_descriptor_limit_the_manager_still_serves_new_clients(tag):
    # The first holder starts the manager with a soft limit of 64 descriptors (hard: 4096);
    # 100 idle connections fill 64. A holder that comes after must still be heard.
    first, _ = holder(tag, 1, limits=(64, 4096))
    idle = [raw_client(tag) for _ in range(100)]
    late, names = holder(tag, 2)
    kill(late)
    try:
        assert names_gone_within(tag, names, 4), "the late holder was never heard: its names leaked"
    finally:
        for s in idle:
            s.close()
        kill(first)
    assert gone_within(tag, 10)


def test_past_its_hard_descriptor_limit_the_manager_refuses_with_a_reason_and_does_not_spin(tag):
    first, _ = holder(tag, 1, limits=(64, 64))
    manager = manager_pid(tag)
    idle = [raw_client(tag) for _ in range(100)]
    try:
        extra = raw_client(tag)
        extra.settimeout(5)
        try:
            said = extra.recv(1024).decode()
        except socket.timeout:
            said = "(nothing in 5 s)"
        extra.close()

        def cpu():
            return _proc.stat(manager).cpu_seconds

        start, t0 = cpu(), time.monotonic()
        time.sleep(1.0)                          # measuring its CPU over a second
        used = (cpu() - start) / (time.monotonic() - t0)
    finally:
        for s in idle:
            s.close()
        kill(first)
    assert said.startswith("REFUSED") and "descriptor" in said and "Fix:" in said, said
    assert used < 0.03, f"the manager used {used:.0%} of a CPU while full"
    assert gone_within(tag, 10)


def test_a_manager_full_of_clients_still_looks_at_the_names_it_adopted_and_lives_on(tag):
    # The next manager looks at /proc for a killed one's names every CHECK_SECONDS. Full of
    # clients up to its hard limit, it had no descriptor left for that look: listdir('/proc')
    # raised EMFILE and it died (1 run in 5 of the test above), leaving every name in /dev/shm.
    from mpviz.sharing.shm_daemon import CHECK_SECONDS
    alive, alive_names = holder(tag, 1)          # a name the killed manager knew ...
    os.kill(manager_pid(tag), signal.SIGKILL)
    first, _ = holder(tag, 1, limits=(64, 64))   # ... adopted by the next one, at 64 fds
    manager = manager_pid(tag)
    idle = [raw_client(tag) for _ in range(100)]
    try:
        deadline = time.monotonic() + 3 * CHECK_SECONDS + 0.5   # it must live through 3 looks
        while time.monotonic() < deadline and _proc.alive(_proc.stat(manager)):
            time.sleep(0.05)
        assert _proc.alive(_proc.stat(manager)), "the manager died while full of clients"
    finally:
        for s in idle:
            s.close()
        kill(first)
        kill(alive)
    assert gone_within(tag, 10), f"{_names(tag)} left: {alive_names} was adopted"


def test_the_names_a_killed_manager_knew_are_adopted_by_the_next_one(tag):
    dead, dead_names = holder(tag, 3)
    alive, alive_names = holder(tag, 2)
    try:
        os.kill(manager_pid(tag), signal.SIGKILL)
        kill(dead)                               # nobody is left to say it died
        # Any later mpviz client starts the next manager, which finds the names.
        subprocess.run([sys.executable, "-c", "import mpviz, mpviz.multiprocessing as mp; "
                        "mp.set_sharing_strategy('file_system'); mpviz.zeros(1).share_memory_()"],
                       env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT), check=True,
                       timeout=60)
        assert names_gone_within(tag, dead_names, 5), "the dead holder's names were not adopted"
        assert set(alive_names) <= {"/" + n for n in _names(tag)}, "a live holder's names went"
    finally:
        kill(alive)
    assert gone_within(tag, 5), "the live holder's adopted names stayed after it was killed"


@pytest.mark.parametrize("value, enabled", [("off", False), ("no", False), ("0", False),
                                            ("on", True), ("1", True), ("", True)])
def test_the_manager_switch_understands_off_and_on(value, enabled):
    run = subprocess.run([sys.executable, "-c", "from mpviz.sharing import shm_manager as m; "
                          "print(m.enabled())"], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, MPVIZ_SHM_MANAGER=value, PYTHONPATH=ROOT))
    assert run.stdout.strip() == str(enabled), run.stderr


def test_a_manager_switch_that_is_neither_on_nor_off_is_refused_clearly():
    run = subprocess.run([sys.executable, "-c", "import mpviz"], capture_output=True, text=True,
                         env=dict(os.environ, MPVIZ_SHM_MANAGER="maybe", PYTHONPATH=ROOT),
                         timeout=60)
    assert run.returncode != 0
    assert "MPVIZ_SHM_MANAGER='maybe' is neither on nor off" in run.stderr
    assert "Fix: MPVIZ_SHM_MANAGER=0" in run.stderr


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)  # (restored afterwards)
def test_mpviz_shm_judges_hundreds_of_names_in_seconds(strategy):
    import mpviz
    import mpviz.multiprocessing as mp
    mp.set_shm_manager(False)                    # nobody to ask: the /proc path, the slow one
    try:
        kept = [mpviz.zeros(2).share_memory_() for _ in range(300)]
    finally:
        mp.set_shm_manager(True)
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "mpviz", "shm"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    took = time.monotonic() - t0
    mine = f"HELD: mapped by pid {os.getpid()}"
    held = [line for line in run.stdout.splitlines() if mine in line]
    del kept
    assert len(held) == 300, run.stdout[-2000:] + run.stderr[-2000:]
    assert took < 5, f"mpviz shm took {took:.1f} s for 300 names"


def test_a_relative_manager_directory_is_refused_clearly(tag):
    run = subprocess.run([sys.executable, "-c", "import mpviz, mpviz.multiprocessing as mp; "
                          "mp.set_sharing_strategy('file_system'); mpviz.zeros(1).share_memory_()"],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, MPVIZ_SHM_TAG=tag, MPVIZ_SHM_MANAGER_DIR="run",
                                  PYTHONPATH=ROOT))
    assert run.returncode != 0
    assert "MPVIZ_SHM_MANAGER_DIR='run' is not an absolute path" in run.stderr, run.stderr
    assert "Fix:" in run.stderr and not _names(tag)


def test_mpviz_shm_says_why_a_leaked_name_stays_while_a_manager_runs_and_how_to_remove_it(tag):
    p, held = holder(tag, 1)                     # the tag's manager runs (and answers for it)
    leaker = subprocess.run(
        [sys.executable, "-c", "import os, signal, mpviz, mpviz.multiprocessing as mp; "
         "mp.set_sharing_strategy('file_system'); t = mpviz.zeros(4).share_memory_(); "
         "print(t.untyped_storage().segment_name, flush=True); "
         "os.kill(os.getpid(), signal.SIGKILL)"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, MPVIZ_SHM_TAG=tag, MPVIZ_SHM_MANAGER="off", PYTHONPATH=ROOT))
    leaked = leaker.stdout.strip()
    try:
        run = subprocess.run([sys.executable, "-m", "mpviz", "shm"], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT))
    finally:
        kill(p)
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if line.startswith("/dev")}
    assert "HELD" in lines["/dev/shm" + held[0]], run.stdout
    said = lines["/dev/shm" + leaked]
    assert "LEAKED" in said, said
    assert "no shm manager" not in said, said    # one runs: it answered for the held name
    assert "never told of it" in said and "manager off" in said, said
    assert f"Fix: rm /dev/shm{leaked}" in run.stdout, run.stdout


def share_one(tag, **env):
    """A fresh Python that shares one tensor by file_system, with `env`: its CompletedProcess."""
    return subprocess.run([sys.executable, "-c", "import mpviz, mpviz.multiprocessing as mp; "
                           "mp.set_sharing_strategy('file_system'); "
                           "mpviz.zeros(1).share_memory_()"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT, **env))


def test_a_manager_directory_that_cannot_be_made_is_refused_clearly_not_a_silent_leak(tag,
                                                                                       tmp_path):
    # A typo in MPVIZ_SHM_MANAGER_DIR: before, the manager silently never started, and the
    # names of a killed process stayed in /dev/shm.
    missing = tmp_path / "no" / "such"
    run = share_one(tag, MPVIZ_SHM_MANAGER_DIR=str(missing))
    assert run.returncode != 0, "shared without a manager, and said nothing"
    assert f"MPVIZ_SHM_MANAGER_DIR={str(missing)!r}" in run.stderr, run.stderr
    assert "No such file or directory" in run.stderr and "Fix:" in run.stderr, run.stderr
    assert not _names(tag)


def test_a_manager_directory_of_yours_left_open_is_refused_with_chmod_as_the_fix(tag, tmp_path):
    (tmp_path / f"mpviz-{os.getuid()}").mkdir(mode=0o755)
    os.chmod(tmp_path / f"mpviz-{os.getuid()}", 0o755)     # yours, readable by others
    run = share_one(tag, MPVIZ_SHM_MANAGER_DIR=str(tmp_path))
    assert run.returncode != 0 and "mode 755" in run.stderr, run.stderr
    assert "another user may have made it" not in run.stderr, run.stderr   # you did
    assert f"Fix: chmod 700 {tmp_path / f'mpviz-{os.getuid()}'}" in run.stderr, run.stderr
    assert not _names(tag)


SHARE_AGAIN = """
    import json, sys
    import mpviz, mpviz.multiprocessing as mp
    mp.set_sharing_strategy("file_system")
    kept = [mpviz.zeros(4).share_memory_() for _ in range(3)]
    print(json.dumps([t.untyped_storage().segment_name for t in kept]), flush=True)
    sys.stdin.readline()
    kept.append(mpviz.zeros(4).share_memory_())   # one message, to a manager that is gone
    print("shared", flush=True)
    sys.stdin.read()
"""


def test_a_client_whose_manager_was_killed_starts_the_next_one_at_once(tag):
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SHARE_AGAIN)],
                         env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    json.loads(p.stdout.readline())
    manager = manager_pid(tag)
    os.kill(manager, signal.SIGKILL)             # (the OOM killer's choice, or a kill -9)
    deadline = time.monotonic() + 10             # dead, its socket closed: not only signalled
    while _proc.alive(_proc.stat(manager)):      # (a zombie counts as dead)
        assert time.monotonic() < deadline, "the manager did not die of SIGKILL in 10 s"
        time.sleep(0.01)
    p.stdin.write("go\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "shared"
    # That one message found the manager gone: the client must start the next one then, and
    # tell it all it holds -- not at some later message, which may never come ...
    kill(p)
    # ... so that its names still go when it is killed, with no other client to help.
    assert gone_within(tag, 10), f"{len(_names(tag))} of 4 names left after the holder died"


@pytest.fixture
def short_tmp():
    """A private folder with a short path: the manager's socket path must fit in 108 bytes,
    and pytest's tmp_path under a worker of `-n 2` (.../pytest-N/popen-gw0/test_...) does not."""
    path = tempfile.mkdtemp(prefix="mpviz-f-", dir="/tmp")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def test_a_manager_that_cannot_start_is_said_once_and_the_program_does_not_crawl(tag, short_tmp):
    tmp_path = short_tmp
    # Something sits where the manager's socket must go (here a directory): every start fails.
    # Before, each message to the manager tried again and waited 5 s: 3 shares took ~45 s,
    # and nothing was said.
    old = os.environ.get("MPVIZ_SHM_MANAGER_DIR")
    os.environ["MPVIZ_SHM_MANAGER_DIR"] = str(tmp_path)
    try:
        os.makedirs(address(tag))
    finally:
        if old is None:
            del os.environ["MPVIZ_SHM_MANAGER_DIR"]
        else:
            os.environ["MPVIZ_SHM_MANAGER_DIR"] = old
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-c", "import mpviz, mpviz.multiprocessing as mp; "
                          "mp.set_sharing_strategy('file_system'); "
                          "kept = [mpviz.zeros(1).share_memory_() for _ in range(3)]"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MPVIZ_SHM_TAG=tag, PYTHONPATH=ROOT,
                                  MPVIZ_SHM_MANAGER_DIR=str(tmp_path)))
    took = time.monotonic() - t0
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("could not be started") == 1, run.stderr
    assert "shares without it" in run.stderr and "Fix:" in run.stderr, run.stderr
    assert took < 15, f"3 shares took {took:.0f} s"
    assert "Is a directory" in run.stderr, run.stderr   # the daemon's own reason, passed on
    assert took < 4, f"3 shares took {took:.1f} s: the failed start was waited for"
