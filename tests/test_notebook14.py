"""Notebook 14 (debugging child processes): each claim the lesson makes, checked on real
processes -- a real Jupyter kernel (jupyter_client + ipykernel, as nbval and JupyterLab run one),
real signals to real process groups, a real SIGKILLed parent, real faulthandler dumps.
"""
import json
import logging
import logging.handlers
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpviz.exercises as ex
from mpviz.examples import debugging as dbg
from mpviz.exercises import nb14

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "14_debugging_children.ipynb"


# --- in a real kernel ---------------------------------------------------------------------------

class Kernel:
    """A real ipykernel started by jupyter_client (in its own session, as Jupyter starts one);
    `run(code)` returns the cell's stream outputs and every stream message of earlier cells that
    arrived meanwhile, as (cell it was sent to, name, text)."""

    def __init__(self, under_pytest, terminal):
        from jupyter_client import KernelManager
        env = dict(os.environ)
        if not under_pytest:          # as JupyterLab starts it: ipykernel captures fds 1 and 2
            env.pop("PYTEST_CURRENT_TEST", None)
        self.km = KernelManager()
        self.terminal = terminal      # the kernel's own stdout and stderr: Jupyter's terminal
        self.out = open(terminal, "wb")          # kept open: a restart starts it again
        self.km.start_kernel(stdout=self.out, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.cells = {}

    def run(self, code, name, timeout=30):
        self.cells[self.kc.execute(code)] = name
        return self.finish(name, timeout)

    def finish(self, name, timeout=30, raised=None):
        """Wait until cell `name` has finished; its streams and any others that came. An
        error in it fails the test, unless it is the exception named `raised`."""
        streams = []
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            parent = self.cells.get(msg["parent_header"].get("msg_id"))
            if msg["msg_type"] == "stream":
                streams.append((parent, msg["content"]["name"], msg["content"]["text"]))
            elif msg["msg_type"] == "error" and parent == name and \
                    msg["content"]["ename"] != raised:
                raise AssertionError(f"{name}: {msg['content']['ename']}: "
                                     f"{msg['content']['evalue']}")
            elif msg["msg_type"] == "status" and parent == name and \
                    msg["content"]["execution_state"] == "idle":
                return streams

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self.out.close()
        _close_jupyters_loop()


def _close_jupyters_loop():
    """Close the event loop that jupyter_client's calls made, or its fds outlive the test."""
    from jupyter_core.utils import _loop
    loop = _loop.get()
    if loop is not None and not loop.is_closed():
        loop.close()


@pytest.fixture(params=[False], ids=["as JupyterLab starts it"])
def kernel(request, tmp_path):
    k = Kernel(under_pytest=request.param, terminal=tmp_path / "terminal")
    k.run("import multiprocessing as mp, os, time\n"
          "from mpviz.examples import debugging as dbg\n"
          "fork, spawn = mp.get_context('fork'), mp.get_context('spawn')", "setup")
    yield k
    k.close()


def _text(streams, cell):
    return "".join(text for parent, _, text in streams if parent == cell)


TALK = ("for c in (fork, spawn):\n"
        "    p = c.Process(target=dbg.talk, args=(c.get_start_method(),))\n"
        "    p.start(); p.join()")
WAYS = ("print()", "sys.stderr.write()", "os.write(1, ...)", "os.write(2, ...)")


@pytest.mark.timeout(120)
def test_in_jupyterlab_every_line_of_fork_and_spawn_children_reaches_a_cell(kernel):
    """The forked child's print() goes through its copy of the kernel's sys.stdout, to the cell
    that started it; raw fd writes (every line of a spawned child) are forwarded by a kernel
    thread, to the cell running when they arrive: this one or, a moment late, the next; and
    copied to Jupyter's terminal."""
    streams = kernel.run(TALK, "talk")
    streams += kernel.run("time.sleep(1)", "next")
    text = _text(streams, "talk") + _text(streams, "next")
    for method in ("fork", "spawn"):
        for way in WAYS:
            assert f"{method}: {way}" in text, (method, way, streams)
    assert "fork: print()" in _text(streams, "talk")
    assert "spawn: print()" in kernel.terminal.read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kernel", [True], ids=["as nbval starts it"], indirect=True)
def test_under_pytest_only_the_forked_childs_sys_streams_reach_the_cell(kernel):
    """ipykernel leaves fds 1 and 2 alone when PYTEST_CURRENT_TEST is set (nbval's kernel):
    raw writes, and all of a spawned child's output, go to the kernel's terminal."""
    streams = kernel.run(TALK, "talk")
    streams += kernel.run("time.sleep(1)", "next")
    text = _text(streams, "talk") + _text(streams, "next")
    assert "fork: print()" in text and "fork: sys.stderr.write()" in text, streams
    terminal = kernel.terminal.read_text()
    for line in ["fork: os.write(1, ...)", "fork: os.write(2, ...)"] + \
            [f"spawn: {way}" for way in WAYS]:
        assert line not in text and line in terminal, (line, streams, terminal)


@pytest.mark.timeout(120)
def test_a_late_line_goes_to_the_starting_cell_if_forked_to_the_running_cell_if_spawned(kernel):
    kernel.run("late = [fork.Process(target=dbg.talk_later, args=('late fork', 1.0)),\n"
               "        spawn.Process(target=dbg.talk_later, args=('late spawn', 1.5))]\n"
               "for p in late: p.start()", "start")
    streams = kernel.run("for p in late: p.join(10)", "later cell")
    streams += kernel.run("time.sleep(1)", "last cell")
    assert "late fork: printed" in _text(streams, "start"), streams
    assert "late fork" not in _text(streams, "later cell"), streams
    assert "late spawn: printed" in _text(streams, "later cell") + _text(streams, "last cell")
    assert "late spawn" not in _text(streams, "start"), streams


@pytest.mark.timeout(120)
def test_jupyters_interrupt_reaches_the_kernels_children(kernel, tmp_path):
    notes = tmp_path / "notes"
    kernel.run(f"ps = [c.Process(target=dbg.wait_for_interrupt, args=({str(notes)!r}, 20))\n"
               f"      for c in (fork, spawn)]\n"
               f"for p in ps: p.start()\n"
               f"while len(open({str(notes)!r}).read().splitlines()) < 2 if os.path.exists("
               f"{str(notes)!r}) else True: time.sleep(0.05)", "start")
    kernel.cells[kernel.kc.execute("print('joining', flush=True)\n"
                                   "for p in ps: p.join()")] = "join"        # runs on
    while True:                          # until the cell runs: the interrupt must land in it
        msg = kernel.kc.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "stream" and "joining" in msg["content"]["text"]:
            break
    kernel.km.interrupt_kernel()
    pids = dbg.child_pids(notes)
    assert not dbg.wait_until_gone(pids, 10)
    got = [line for line in dbg.read_notes(notes) if line.startswith("KeyboardInterrupt")]
    assert len(got) == 2, dbg.read_notes(notes)
    kernel.finish("join", raised="KeyboardInterrupt")      # the interrupted cell
    streams = kernel.run("print([p.exitcode for p in ps])", "exit codes")
    assert "[1, 1]" in _text(streams, "exit codes"), [s for s in streams if s[0] != "start"]


@pytest.mark.timeout(120)
def test_a_kernel_restart_ends_the_children_in_its_group_not_one_in_its_own_session(
        kernel, tmp_path):
    notes = tmp_path / "notes"
    kernel.run(f"ps = [fork.Process(target=dbg.wait_for_interrupt, args=({str(notes)!r}, 20)),\n"
               f"      fork.Process(target=dbg.orphan_candidate,\n"
               f"                   args=({str(notes)!r}, 20, True, False))]\n"
               f"for p in ps: p.start()\n"
               f"while len(open({str(notes)!r}).read().splitlines()) < 2 if os.path.exists("
               f"{str(notes)!r}) else True: time.sleep(0.05)", "start")
    # told apart by their groups, not by the order of their notes: the child in its own
    # session may write first (a CI run took it for the one in the group, and failed)
    groups = dbg.child_groups(notes)
    [own_session] = [pid for pid, pgid in groups.items() if pid == pgid]
    [in_group] = [pid for pid, pgid in groups.items() if pid != pgid]
    try:
        kernel.km.restart_kernel(now=False)
        assert not dbg.wait_until_gone([in_group], 10)
        assert dbg.is_running(own_session)            # an orphan now
        assert dbg.parent_of(own_session) != kernel.km.provisioner.pid
    finally:
        if dbg.is_running(own_session):
            os.kill(own_session, signal.SIGKILL)


def test_a_program_started_in_the_background_by_a_script_ignores_sigint():
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import signal; "
                          f"print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)' & wait"],
                         capture_output=True, text=True, timeout=30).stdout
    assert out.strip() == "True", out


# --- the stand-in parent ------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_group_sigint_interrupts_the_parent_and_every_child(tmp_path):
    notes = tmp_path / "notes"
    parent = dbg.start_parent(notes)
    lines = dbg.interrupt(parent, notes)
    out = dbg.stop(parent, notes)
    assert "parent KeyboardInterrupt" in lines
    assert sum(line.startswith("KeyboardInterrupt") for line in lines) == 2, lines
    assert "Process child-fork:" in out and "Process child-spawn:" in out
    assert parent.returncode != 0


@pytest.mark.timeout(120)
def test_children_that_ignore_sigint_run_on_and_the_parent_waits_for_them_at_exit(tmp_path):
    # What notebook 14 says after its cell: the children carry on, and so does the parent, whose
    # exit joins its non-daemon children. The children sleep far longer than the test looks, so
    # a slow start of the spawned one cannot end the fork child's sleep first.
    notes = tmp_path / "notes"
    parent = dbg.start_parent(notes, seconds=60.0, ignore=True)
    try:
        lines = dbg.interrupt(parent, notes, settle=1.0)
        assert "parent KeyboardInterrupt" in lines
        assert not any(line.startswith(("timeout", "KeyboardInterrupt")) for line in lines), lines
        children = dbg.child_pids(notes)
        assert len(children) == 2 and all(dbg.is_running(pid) for pid in children), lines
        assert parent.poll() is None, "the parent ended before its children"
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=30)             # it was waiting for them: it ends once they do,
        assert parent.returncode == -signal.SIGINT      # of the SIGINT it was interrupted by
    finally:
        dbg.stop(parent, notes)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options, outlives", [
    ({}, True), ({"daemon": True}, True), ({"method": "spawn"}, True),
    ({"own_session": True}, True), ({"pdeathsig": True}, False),
    ({"kill": "group"}, False), ({"kill": "group", "own_session": True}, True),
], ids=lambda v: str(v))
def test_who_outlives_a_sigkilled_parent(options, outlives, tmp_path):
    case = dbg.orphan_case(tmp_path / "notes", **options)
    assert case["alive"] is outlives, case
    if outlives:
        assert case["ppid_after"] != case["ppid_before"]       # re-parented


@pytest.mark.timeout(60)
def test_an_orphan_shows_in_ps_with_a_new_parent_and_its_parents_command_line(tmp_path):
    notes = tmp_path / "notes"
    parent = dbg.start_parent(notes, ("fork",), 10.0, own_session=True)
    try:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        [orphan] = dbg.child_pids(notes)
        row = subprocess.run(["ps", "-ww", "-o", "ppid=,cmd=", "-p", str(orphan)],
                             capture_output=True, text=True).stdout.split(None, 1)
        assert int(row[0]) != parent.pid and "parent_main" in row[1], row
    finally:
        dbg.stop(parent, notes)


# --- logging ------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_spawned_child_drops_info_and_writes_warning_through_its_own_basic_config():
    nb14._spawned_child_logs.cache_clear()
    levels, lines = nb14._spawned_child_logs()
    assert levels == ["WARNING"], lines
    assert lines == ["WARNING:root:child: a WARNING message"]


@pytest.mark.timeout(60)
def test_a_queue_listener_gets_every_workers_records_with_its_process_name():
    ctx = multiprocessing.get_context("spawn")
    records = ctx.Queue()
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append((record.processName, record.levelname, record.getMessage()))

    listener = logging.handlers.QueueListener(records, Keep())
    listener.start()
    workers = [ctx.Process(target=dbg.log_through_queue, args=(records, r), name=f"rank-{r}")
               for r in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    listener.stop()
    records.close()
    records.join_thread()
    for r in range(2):
        mine = [g for g in got if g[0] == f"rank-{r}"]
        assert [m[1] for m in mine] == ["INFO"] * 3 + ["WARNING"], got


# --- faulthandler and the report ----------------------------------------------------------------

@pytest.mark.timeout(60)
def test_faulthandler_dumps_after_a_second_and_on_sigusr1_innermost_first(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    path = tmp_path / "stack.txt"
    child = ctx.Process(target=dbg.stuck_in_get, args=(queue, str(path), 10.0))
    child.start()
    try:
        text = dbg.wait_for_dump(path, 10.0, child)
        assert text.startswith("Timeout (0:00:01)!")
        ours = re.findall(r'debugging\.py", line \d+ in (\w+)', text)
        assert ours == ["wait_for_work", "stuck_in_get"], text
        assert text.index("queues.py") < text.index("wait_for_work")
        os.kill(child.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while path.read_text().count("most recent call first") < 2 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.read_text().count("most recent call first") == 2
    finally:
        queue.put(None)
        child.join(15)
        queue.close()
        queue.join_thread()
    assert child.exitcode == 0


def interrupted_recorded_program(kill):
    """Run programs/interrupt_recorded.py in a session of its own; once both children wait,
    send SIGINT with `kill` (os.kill: the parent alone; os.killpg: its whole group, as Jupyter's
    interrupt does). Returns everything it printed."""
    prog = subprocess.Popen([sys.executable, "programs/interrupt_recorded.py"],
                            cwd=ROOT / "notebooks", stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert prog.stdout.readline().strip() == "ready"
        kill(prog.pid, signal.SIGINT)
        out, _ = prog.communicate(timeout=60)
    finally:
        if prog.poll() is None:
            os.killpg(prog.pid, signal.SIGKILL)
            prog.communicate()
    return out


@pytest.mark.timeout(90)
def test_record_reports_both_waiting_children_when_the_parent_alone_is_interrupted():
    out = interrupted_recorded_program(os.kill)
    report = out[out.index("mpviz: INTERRUPTED"):]
    assert "wait_for_work (debugging.py" in report, report
    assert report.count("waits: get() on Queue") == 2, report
    assert "stopped 2 process(es)" in report


# --- the checks ---------------------------------------------------------------------------------

PLAUSIBLE = {
    "14.predict-spawn-logging": [["INFO", "WARNING"], ["INFO"], []],
    "14.fix-orphan": [{"daemon": True}, {"method": "spawn"}, {"own_session": True},
                      {"pdeathsig": False}],
    "14.picture-stack": ["stuck_in_get", "get", "select", "main"],
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("exercise_id", list(PLAUSIBLE))
def test_each_check_says_not_quite_to_a_plausible_wrong_answer(exercise_id):
    for answer in PLAUSIBLE[exercise_id]:
        verdict = ex.judge(exercise_id, answer)
        assert verdict.right is False and len(verdict.why) > 40, (answer, verdict.why)


def test_the_notebook_has_a_cell_per_check_and_stays_small():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for exercise_id in ex.exercises("14"):
        assert f'check("{exercise_id}", ...)' in code
    assert len(cells) < 60
    assert "def " not in code              # workers live in modules, never in cells


@pytest.mark.timeout(120)
def test_nbconvert_keeps_no_line_a_forked_child_prints_after_its_cell_ended():
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import multiprocessing as mp\n"
                                  "from mpviz.examples import debugging as dbg\n"
                                  "p = mp.get_context('fork').Process(target=dbg.talk_later, "
                                  "args=('late fork', 1.0))\np.start()"),
        nbformat.v4.new_code_cell("p.join(10)\nprint('joined', p.exitcode)")])
    try:
        NotebookClient(nb, timeout=60, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        _close_jupyters_loop()
    outputs = json.dumps([cell.outputs for cell in nb.cells])
    assert "joined 0" in outputs and "late fork" not in outputs, outputs


@pytest.mark.timeout(60)
def test_under_forkserver_the_orphan_check_says_the_fork_server_is_the_childs_parent():
    """A forkserver child's parent is the fork server, which outlives the SIGKILLed program (the
    child holds its 'alive' pipe): pdeathsig watches the fork server and never fires. The
    verdict once called it 'an orphan' whose parent 'is now pid X (it was X)'."""
    verdict = ex.judge("14.fix-orphan", {"method": "forkserver", "pdeathsig": True})
    assert verdict.right is False, verdict.why
    assert "fork server" in verdict.why and "an orphan" not in verdict.why, verdict.why


@pytest.mark.timeout(90)
def test_record_reports_both_waiting_children_when_the_whole_group_is_interrupted():
    """Jupyter's ■ sends SIGINT to the whole group: the children unwind at once, yet the report
    holds their stacks (each wrote them at the SIGINT). The notebook once said the children
    usually die before the parent reads their stacks, and interrupted the parent alone."""
    out = interrupted_recorded_program(os.killpg)
    start = out.index("mpviz: INTERRUPTED")
    report = out[start:out.index("Traceback", start)]
    # each child unwinds by itself: before the report (its traceback printed first), or the
    # report was first and the parent stopped it (3.13 showed both) -- never neither
    unwound = out[:start].count("Process worker-")
    stopped = re.search(r"stopped (\d) process\(es\)", report)
    assert unwound + (int(stopped.group(1)) if stopped else 0) >= 2, out
    assert "wait_for_work (debugging.py" in report, report          # their stacks are here
    assert report.count("waits: get() on Queue") == 2, report
    assert sum(f"(worker-{i}):" in report for i in range(2)) == 2, report
    text = json.loads(NOTEBOOK.read_text())["cells"]
    cells = ["".join(c["source"]) for c in text]
    assert any("os.killpg(prog.pid, signal.SIGINT)" in c for c in cells)
    assert not any("usually before the parent reads their stacks" in c for c in cells)
