"""What a process pays before its first line: ``import mpviz``, ``mpviz trace``, spawned children.

NumPy costs ~0.1 s to import (more on a loaded machine), the stdlib's multiprocessing hooks
more: a process that does not use them must not import them. Each check runs a fresh
interpreter (or a real spawned child) and looks at ``sys.modules``: what was imported, not how
long it took, so that the checks hold on a busy machine. The timings are in bench/startup.py.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fresh_python(code, cwd=ROOT, args=()):
    """Run `code` (a script file's text) in a new interpreter with this checkout's mpviz; stdout."""
    path = os.path.join(cwd, "startup_check.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(code))
    result = subprocess.run([sys.executable, path, *args], cwd=cwd, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_import_mpviz_and_the_trace_launcher_do_not_import_numpy(tmp_path):
    out = fresh_python("""
        import sys
        import mpviz
        import mpviz.cli
        from mpviz.trace import launcher, watchdog
        heavy = [m for m in ("numpy", "matplotlib", "mpviz.trace.hooks") if m in sys.modules]
        print(heavy)
    """, cwd=tmp_path)
    assert out.strip() == "[]"


def test_the_tensor_api_loads_on_first_use_and_keeps_torchs_names(tmp_path):
    """`mpviz.tensor` is torch's function even after mpviz/tensor.py (the module) was imported
    by another road, as mpviz.nn imports it; `from mpviz import *` and dir() list the API."""
    out = fresh_python("""
        import mpviz.nn
        import mpviz
        t = mpviz.tensor([1.0, 2.0])
        assert type(t) is mpviz.Tensor and t.dtype == mpviz.float32, (type(t), t.dtype)
        assert mpviz.zeros(3).tolist() == [0.0, 0.0, 0.0]
        assert "zeros" in dir(mpviz) and "nn" in dir(mpviz)
        namespace = {}
        exec("from mpviz import *", namespace)
        assert namespace["float32"] is mpviz.float32 and "np" not in namespace
        print("ok")
    """, cwd=tmp_path)
    assert out.strip() == "ok"


def test_a_tensor_sent_before_mpviz_multiprocessing_is_imported_travels_as_a_handle(tmp_path):
    """The stdlib's pickler finds tensor.py's stand-in reducer, which loads the real one: the
    tensor is moved to shared memory and its handle (not its bytes) is pickled."""
    out = fresh_python("""
        import sys
        from multiprocessing.reduction import ForkingPickler
        import mpviz
        t = mpviz.ones(1 << 16)
        assert "mpviz.multiprocessing.reductions" not in sys.modules
        data = bytes(ForkingPickler.dumps(t))
        assert t.is_shared() and len(data) < 4096, len(data)
        back = ForkingPickler.loads(data)
        back[0] = 7.0
        print(float(t[0]))
    """, cwd=tmp_path)
    assert out.strip() == "7.0"


def test_spawned_children_import_only_what_their_main_imports(tmp_path):
    """A script that imports only mpviz.multiprocessing: its spawned children (which import the
    script again) start without NumPy -- and a tensor sent to one still arrives."""
    out = fresh_python("""
        import sys
        import mpviz.multiprocessing as mp

        def child(rank, queue):
            queue.put((rank, "numpy" in sys.modules))

        def receiver(rank, queue):
            t = queue.get()
            t += 1                      # the parent sees it: shared memory, not a copy

        if __name__ == "__main__":
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(child, args=(queue,), nprocs=2)
            print(sorted(queue.get() for _ in range(2)))
            import mpviz
            t = mpviz.zeros(4)
            queue.put(t)
            mp.spawn(receiver, args=(queue,), nprocs=1)
            print(t.tolist())
    """, cwd=tmp_path)
    assert out.splitlines() == ["[(0, False), (1, False)]", "[1.0, 1.0, 1.0, 1.0]"]
