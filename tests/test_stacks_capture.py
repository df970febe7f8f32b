"""How mpviz asks a process for its stacks (trace/session.py): SIGUSR1, which faulthandler
answers by writing every thread's stacks from inside the signal handler, without the GIL. A
thread that runs Python meanwhile changes the frames being read: hang_logging_pool.py's busy
logging thread crashed its process so (SIGSEGV), 3-4 runs in 24 under load. The signal now goes
to the thread that runs, when one alone does: it is inside the handler while its frames are
read, and the others wait for the GIL (0 crashes in 60 runs)."""
import os
import subprocess
import sys
import textwrap

import pytest

from mpviz.trace import session

pytestmark = pytest.mark.timeout(60)

BUSY = textwrap.dedent("""
    import faulthandler, os, signal, sys, threading
    stacks = open(os.path.join(sys.argv[1], f"{os.getpid()}.txt"), "w")  # (where mpviz reads)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    def heartbeat():                  # a thread that runs Python all the time
        beat = 0
        while True:
            beat += 1

    busy = threading.Thread(target=heartbeat, name="heartbeat", daemon=True)
    busy.start()
    print(f"{busy.ident:#018x}", flush=True)
    threading.Event().wait()          # the main thread waits, with no time limit
""")


def test_the_stacks_are_asked_of_the_one_thread_that_runs(tmp_path):
    (tmp_path / "busy.py").write_text(BUSY)
    os.mkdir(tmp_path / "stacks")
    proc = subprocess.Popen([sys.executable, str(tmp_path / "busy.py"), str(tmp_path / "stacks")],
                            stdout=subprocess.PIPE, text=True)
    try:
        busy = proc.stdout.readline().strip()
        for _ in range(5):
            out = session.capture_stacks([proc.pid], {proc.pid: "busy"}, str(tmp_path / "stacks"))
            text = out[proc.pid]["stacks"]
            assert f"Current thread {busy} (most recent call first):" in text, text
            assert proc.poll() is None, "the process died of the dump"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
