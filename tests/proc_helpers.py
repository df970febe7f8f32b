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
