"""mpviz's reducers are registered in one place, and every class that travels uses them.

multiprocessing's pickler looks a reducer up by the object's exact type. mpviz registers its
reducers in ``mpviz/multiprocessing/reductions.py:init_reductions`` only (as torch does); the
classes' own modules register nothing but storage.py's stand-in (which loads reductions at the
first send) and "sent as its base is" for a subclass. Checked by reading the source, and by
sending tensors through the standard library's multiprocessing from a program that never
imports mpviz.multiprocessing, as its author would write it.
"""
import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mpviz"
THE_PLACE = "multiprocessing/reductions.py"
# what a module other than THE_PLACE may register: the stand-in, or a copy of a base's entry
NOT_A_REDUCER = {"reduce_on_first_send", "ForkingPickler._extra_reducers[base]"}

pytestmark = pytest.mark.timeout(90)


def registrations():
    """[(file, line, what it registers)] for every ``ForkingPickler.register(cls, reducer)``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "ForkingPickler.register"
                    and len(node.args) == 2):
                found.append((path.relative_to(PACKAGE).as_posix(), node.lineno,
                              ast.unparse(node.args[1])))
    return found


def test_every_reducer_is_registered_in_reductions_and_nowhere_else():
    found = registrations()
    assert any(f == THE_PLACE for f, _, _ in found), f"the scan found no registration: {found}"
    elsewhere = [(f, line, what) for f, line, what in found
                 if f != THE_PLACE and what not in NOT_A_REDUCER]
    assert not elsewhere, (f"reducers registered outside {THE_PLACE}: {elsewhere}. Fix: register "
                           f"them in init_reductions, the one place a reader looks")


PROGRAM = textwrap.dedent("""
    import multiprocessing as mp
    import sys
    import mpviz as torch
    from mpviz import nn

    class Frozen(nn.Parameter):            # the program's own kind of parameter
        def __init__(self, data):
            super().__init__(data, requires_grad=False)

    def child(inbox, outbox, t, p):
        t.add_(1)                          # a Process argument (pickled under spawn)
        inbox.get().mul_(2)                # through a stdlib Queue
        p.data.fill_(7)                    # an nn.Parameter
        s = inbox.get()
        outbox.put((type(s).__name__, s.is_shared()))

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        inbox, outbox = ctx.Queue(), ctx.Queue()
        t, x, p = torch.zeros(4), torch.ones(3), nn.Parameter(torch.zeros(2))
        c = ctx.Process(target=child, args=(inbox, outbox, t, p))
        c.start()
        inbox.put(x)
        inbox.put(Frozen(torch.ones(2)))
        got = outbox.get(timeout=60)
        c.join(60)
        print(t.tolist(), x.tolist(), p.tolist(), got, c.exitcode)
        try:
            mp.reduction.ForkingPickler.dumps(torch.ones(2).cuda().untyped_storage())
        except RuntimeError as e:
            print(str(e).split("(")[0].strip())
""")


def test_tensors_sent_by_the_stdlib_alone_travel_as_handles(tmp_path):
    # Shared, not copied: the child's writes are seen here, for a Process argument, a tensor on
    # a stdlib Queue and an nn.Parameter; a bare CUDA storage is refused as torch refuses it.
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MPVIZ_CUDA_BACKEND="simulator")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=80)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[1.0, 1.0, 1.0, 1.0] [2.0, 2.0, 2.0] [7.0, 7.0] ("), r.stdout
    assert lines[0].endswith("('Frozen', True) 0"), r.stdout
    assert lines[1] == "Cannot pickle CUDA storage; try pickling a CUDA tensor instead", r.stdout


def test_a_subclass_defined_after_the_reducers_are_loaded_is_sent_as_a_tensor():
    from multiprocessing.reduction import ForkingPickler

    import mpviz
    from mpviz.multiprocessing import reductions

    class Late(mpviz.Tensor):
        pass

    assert ForkingPickler._extra_reducers[Late] is reductions.reduce_tensor
    assert ForkingPickler._extra_reducers[mpviz.Storage] is reductions.reduce_storage
