"""Redraw the pictures in docs/images/ from real runs -- the runs README.md and docs/ describe.

    PYTHONPATH=. python docs/images/make_images.py              # every picture but the widget
    PYTHONPATH=. python docs/images/make_images.py your_own_hang stepped_wait_for

Each picture is drawn from a run made now, with the code of this checkout, so a picture never
shows what older code drew. Each run is the one the text beside the picture describes:

    timeline_producer_consumer   scenario producer-exits, wait=True (the tutorial's producer and
                                 consumer, spawn; the producer waits until the consumer is done)
    memory_map_fs_leak           scenario fs-leak, manager=False (notebook 03)
    wait_for_fork_lock           scenario fork-held-lock, its wait-for graph (notebook 04)
    timeline_fork_lock           the same run's timeline (`mpviz run fork-held-lock --plot`)
    stepped_wait_for             lock-order stepped into its deadlock, as notebook 09 does
    your_own_hang                docs/TRACE.md: mpviz trace --hang-after 2 ... hang_join.py
    your_own_torch               docs/TRACE.md: mpviz trace --plot ... torch_queue.py
    live_widget                  not drawn here: a screenshot of JupyterLab, taken by the browser
                                 test (see ELSEWHERE below for the command)

Pictures are saved at 100 dpi (small files: the README and docs/ show them at page width anyway).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DPI = 100


def _save(fig, name):
    path = os.path.join(HERE, name + ".png")
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    print(f"{name}.png: {os.path.getsize(path) // 1024} KiB")


def _scenario(name, **params):
    from mpviz import scenarios
    result = scenarios.run(name, **params)
    print(f"{name} {params}: {result.outcome}")
    return result


def timeline_producer_consumer():
    from mpviz import viz
    _save(viz.timeline(_scenario("producer-exits", wait=True).trace), "timeline_producer_consumer")


def memory_map_fs_leak():
    from mpviz import viz
    _save(viz.memory_map(_scenario("fs-leak", manager=False).trace), "memory_map_fs_leak")


_FORK_LOCK = {}


def _fork_lock_run():
    """One fork-held-lock run for both of its pictures (they then tell of the same pids)."""
    if "run" not in _FORK_LOCK:
        _FORK_LOCK["run"] = _scenario("fork-held-lock")
    return _FORK_LOCK["run"]


def wait_for_fork_lock():
    from mpviz import viz
    _save(viz.wait_for(_fork_lock_run().trace), "wait_for_fork_lock")


def timeline_fork_lock():
    from mpviz import viz
    _save(viz.timeline(_fork_lock_run().trace), "timeline_fork_lock")


def stepped_wait_for():
    """Notebook 09's lock-order cells: start the child, main takes A, the child takes B, then
    each asks for the other's lock."""
    import mpviz.scenarios as sc
    s = sc.step("lock-order")
    try:
        for who in ("main/main", "main/main", "child/main", "main/main", "child/main"):
            s.step(who)
        print("lock-order stepped:", s.state().outcome)
        _save(s.wait_for(), "stepped_wait_for")
    finally:
        s.close()


def _trace_cli(name, args):
    """Run docs/TRACE.md's `mpviz trace ...` command in a temporary folder; keep timeline.png."""
    out = tempfile.mkdtemp(prefix="mpviz_images_")
    try:
        cmd = [sys.executable, "-m", "mpviz", "trace", *args, "-o", out, "--", sys.executable]
        run = subprocess.run(cmd + _TRACED[name], cwd=ROOT, capture_output=True, text=True)
        print(f"{name}: mpviz trace exited {run.returncode}")
        picture = os.path.join(out, "timeline.png")
        if not os.path.exists(picture):
            sys.exit(f"{name}: mpviz trace drew no timeline.png:\n{run.stdout}\n{run.stderr}")
        # the launcher's own picture, as docs/TRACE.md's command makes it (matplotlib's 100 dpi;
        # with, under it, anything the trace could not record)
        shutil.copyfile(picture, os.path.join(HERE, name + ".png"))
        print(f"{name}.png: {os.path.getsize(picture) // 1024} KiB")
    finally:
        shutil.rmtree(out, ignore_errors=True)


_TRACED = {"your_own_hang": ["notebooks/programs/hang_join.py"],
           "your_own_torch": ["notebooks/programs/torch_queue.py"]}


def your_own_hang():
    _trace_cli("your_own_hang", ["--hang-after", "2"])


def your_own_torch():
    _trace_cli("your_own_torch", ["--plot"])


PICTURES = {
    "timeline_producer_consumer": timeline_producer_consumer,
    "memory_map_fs_leak": memory_map_fs_leak,
    "wait_for_fork_lock": wait_for_fork_lock,
    "timeline_fork_lock": timeline_fork_lock,
    "stepped_wait_for": stepped_wait_for,
    "your_own_hang": your_own_hang,
    "your_own_torch": your_own_torch,
}
# made elsewhere, by a test that drives a real browser: listed so that every PNG here has a maker
ELSEWHERE = {"live_widget": "a screenshot of 00_overview's Live widget in JupyterLab (Chromium), "
                            "taken by `MPVIZ_README_SHOT=1 PYTHONPATH=. python -m pytest "
                            "'tests/test_browser.py::test_workshop_notebook_live[00_overview]'`"}


def main(names):
    unknown = [n for n in names if n not in PICTURES and n not in ELSEWHERE]
    if unknown:
        sys.exit(f"make_images.py: no picture called {', '.join(unknown)}. Fix: pick from "
                 f"{', '.join(PICTURES)}")
    for name in names or PICTURES:
        if name in ELSEWHERE:
            print(f"{name}.png is not drawn here: {ELSEWHERE[name]}")
            continue
        PICTURES[name]()


if __name__ == "__main__":
    main([n[:-4] if n.endswith(".png") else n for n in sys.argv[1:]])
