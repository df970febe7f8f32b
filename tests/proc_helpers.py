"""Starting and finishing a test's child processes (shared by the test modules)."""


def start(ctx, target, *args):
    """Start ``target(*args)`` in a new process of context `ctx`; return the process."""
    p = ctx.Process(target=target, args=args)
    p.start()
    return p


def finish(*processes, timeout=30):
    """Join the processes and require that each exited cleanly."""
    for p in processes:
        p.join(timeout)
        assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"


def run_with_small_dev_shm(size, code, timeout):
    """Run ``python -c code`` with /dev/shm a fresh tmpfs of `size` ("32m"), in a private mount
    namespace (root only; nothing outside it sees the mount): the CompletedProcess. Skips the
    test where no such mount can be made."""
    import os
    import subprocess
    import sys

    import pytest
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh",
                          sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root), timeout=timeout)
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"no private tmpfs here: {out.stderr.strip()}")
    return out
