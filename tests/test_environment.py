"""Where the workshop runs besides ``./run``: Binder/JupyterHub, and a machine with a small /dev/shm.

* Binder builds ``environment.yml`` with conda. Resolving it needs conda-forge's package index
  (a download this test suite does not make), so what is checked here is that it names the
  same packages, with the same lower bounds, as ``pyproject.toml``'s dependencies and its
  ``notebooks`` and ``test`` extras, that its Python satisfies ``requires-python``, and that it
  installs mpviz itself. A package added to one file and not the other fails here.
* Docker gives a container a 64 MiB ``/dev/shm``. The scenarios that share memory must reach
  the same verdicts there: run them inside a private mount namespace whose ``/dev/shm`` is a
  64 MiB tmpfs (needs root and ``unshare``; skipped elsewhere, with the reason). Nothing leaks
  to this machine's ``/dev/shm``: the namespace's tmpfs goes away with its last process.
  The namespace has its own network namespace too, as a Docker container has: the shm manager
  listens on an *abstract* Unix socket, which belongs to the network namespace, so with a
  private mount namespace alone the runs inside would find a manager running outside -- one
  that sees the other /dev/shm, and cannot unlink what was made inside (fs-leak then says LEAK
  now and then, depending on whether such a manager is alive).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

try:
    import tomllib
except ImportError:          # Python 3.10
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = re.compile(r"^([A-Za-z0-9_.\-]+)\s*((?:[<>=!~]=?|=)\s*[0-9][0-9A-Za-z.*]*)?$")


def environment_yml():
    """(conda packages {name: bound}, pip lines) of environment.yml, read line by line: its
    layout is fixed (a `dependencies:` list, one `- pip:` sub-list), so no YAML library is
    needed."""
    conda, pip, section = {}, [], None
    with open(os.path.join(ROOT, "environment.yml")) as f:
        for raw in f:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            if not line.startswith(" "):
                section = line.split(":", 1)[0]
                continue
            if section != "dependencies":
                continue
            item = line.strip()
            if item == "- pip:":
                section = "pip"
                continue
            assert item.startswith("- "), f"environment.yml: unexpected line {raw!r}"
            match = SPEC.match(item[2:].strip())
            assert match, f"environment.yml: cannot read the package spec {item!r}"
            conda[match.group(1).lower()] = (match.group(2) or "").replace(" ", "")
    # (the pip sub-list: whatever follows "- pip:", more indented)
    with open(os.path.join(ROOT, "environment.yml")) as f:
        text = f.read()
    block = text.split("- pip:", 1)[1] if "- pip:" in text else ""
    pip = [line.strip()[2:].strip() for line in block.splitlines() if line.strip().startswith("- ")]
    return conda, pip


def pyproject():
    if tomllib is None:
        pytest.skip("tomllib is Python 3.11+: this check runs there")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def test_environment_yml_names_pyprojects_packages_and_extras():
    project = pyproject()
    wanted = {}
    for spec in (project["dependencies"] + project["optional-dependencies"]["notebooks"]
                 + project["optional-dependencies"]["test"]):
        match = SPEC.match(spec.replace(" ", ""))
        assert match, spec
        wanted[match.group(1).lower()] = match.group(2) or ""
    conda, pip = environment_yml()
    conda.pop("pip", None)
    python = conda.pop("python", None)
    missing = {k: v for k, v in wanted.items() if k not in conda}
    extra = {k: v for k, v in conda.items() if k not in wanted}
    differ = {k: (conda[k], v) for k, v in wanted.items() if k in conda and conda[k] != v}
    assert not missing and not extra and not differ, (
        f"environment.yml and pyproject.toml (dependencies + notebooks + test extras) differ: "
        f"missing from environment.yml {missing}, not in pyproject {extra}, other bounds "
        f"(environment.yml, pyproject) {differ}. Fix: name the same packages with the same "
        f"lower bounds in both")
    assert "-e ." in pip, f"environment.yml must install mpviz itself (pip: - -e .), has {pip}"
    # Its Python must be one that pyproject allows.
    assert python and python.startswith("="), f"environment.yml pins no python: {python!r}"
    version = tuple(int(p) for p in python.lstrip("=").split(".")[:2])
    low = tuple(int(p) for p in project["requires-python"].lstrip(">=").split(".")[:2])
    assert version >= low, f"environment.yml's python {version} < requires-python {low}"


def test_readme_links_binder_to_the_first_notebook():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "mybinder.org/v2/" in readme and "00_overview.ipynb" in readme
    assert "environment.yml" in readme


# -- the scenarios' verdicts with a 64 MiB /dev/shm ------------------------------------------

# The cheapest runs that still share memory every way: both strategies through a Queue, many
# segments at once, segments left by a killed process, buffers sent back, and the case written
# for a small /dev/shm.
SHARING_RUNS = [
    ["queue-sharing", "--strategy", "file_descriptor"],
    ["queue-sharing", "--strategy", "file_system"],
    ["strategies", "--strategy", "file_system"],
    ["buffer-reuse", "--strategy", "file_system"],
    ["fs-leak"],
    ["small-shm"],
]


def _why_no_namespace():
    if not sys.platform.startswith("linux"):
        return "mount namespaces are Linux's"
    if os.geteuid() != 0:
        return "needs root, to mount a tmpfs in a private mount namespace"
    if not shutil.which("unshare"):
        return "needs unshare(1) (util-linux)"
    probe = subprocess.run(["unshare", "--mount", "--net", "--propagation", "private", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare --mount --net is refused here: {probe.stderr.strip()[:200]}"
    return None


def _verdicts(small_shm):
    """{run: its verdict line's outcome} for SHARING_RUNS, in a 64 MiB /dev/shm or this one."""
    lines = []
    for run in SHARING_RUNS:
        argv = " ".join([sys.executable, "-m", "mpviz", "run"] + run)
        lines.append(f"{argv} | head -n 1")
    script = "\n".join(lines)
    if small_shm:
        script = ("set -e; mount -t tmpfs -o size=64m tmpfs /dev/shm; "
                  f"{sys.executable} -c 'import os; s = os.statvfs(\"/dev/shm\"); "
                  "print(\"shm\", s.f_blocks * s.f_frsize)'\n" + script)
        argv = ["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c", script]
    else:
        argv = ["sh", "-c", script]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    outcomes, size = {}, None
    for line in out.stdout.splitlines():
        if line.startswith("shm "):
            size = int(line.split()[1])
            continue
        match = re.match(r"^(\S+) \[(.*)\]: (\S+) \(", line)
        assert match, f"not a verdict line: {line!r}\n{out.stdout[-2000:]}"
        outcomes[f"{match.group(1)} [{match.group(2)}]"] = match.group(3)
    assert len(outcomes) == len(SHARING_RUNS), out.stdout
    return outcomes, size


@pytest.mark.timeout(900)
def test_the_sharing_scenarios_reach_the_same_verdicts_with_a_64_mib_dev_shm():
    why = _why_no_namespace()
    if why:
        pytest.skip(f"a private 64 MiB /dev/shm: {why}")
    small, size = _verdicts(small_shm=True)
    assert size == 64 << 20, f"the namespace's /dev/shm is {size} bytes, not 64 MiB"
    usual, _ = _verdicts(small_shm=False)
    assert small == usual, (f"verdicts differ with a 64 MiB /dev/shm: "
                            f"{ {k: (usual[k], small.get(k)) for k in usual if usual[k] != small.get(k)} }")
