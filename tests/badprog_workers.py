"""Programs that misbehave towards the recorder, run by tests/test_trace_bad_programs.py as
``python -m mpviz trace -o DIR -- python badprog_workers.py CASE ARGS...`` and untraced, to
compare. Each prints what it saw on stdout, so that a test can check the traced run printed the
same; none of them knows it is traced. ``python badprog_workers.py CASE`` runs one.
"""
import multiprocessing as mp
import os
import sys
import time


def fork_after_closerange():
    """Close every fd above stderr (as a daemon does), open three files -- they get the lowest
    numbers, which were the recorder's -- then fork: the child writes to each of them, then the
    parent to the first."""
    os.closerange(3, 1024)
    a, b, c = open("a.txt", "w"), open("b.txt", "w"), open("c.txt", "w")
    pid = os.fork()
    if pid == 0:
        try:
            for f in (a, b, c):
                f.write("child\n")
                f.flush()
            os._exit(0)
        except OSError as exc:
            print("child lost its file:", exc, flush=True)
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    a.write("parent\n")
    for f in (a, b, c):
        f.close()
    print("child status", os.waitstatus_to_exitcode(status))


def dup2_over_every_fd():
    """Put a file of its own on fds 3..9 (the recorder's log among them), then work enough for
    the recorder to need its log fd again, then write through those fds."""
    fd = os.open("mine.txt", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    for n in range(3, 10):
        if n != fd:
            os.dup2(fd, n)
    q = mp.Queue()
    for i in range(3000):          # ~3000 events: more than the first 16 KiB reserved
        q.put(i)
        q.get()
    for n in range(3, 10):
        os.write(n, b"%d\n" % n)
    print("wrote through fds 3..9")


def hang_after_closerange():
    """Close every fd above stderr, write a file (it gets fd 3), then wait forever on an empty
    queue: the hang watchdog asks for stacks."""
    os.closerange(3, 1024)
    f = open("data.txt", "w")
    f.write("data\n")
    f.flush()
    print("waiting", flush=True)
    mp.Queue().get()


def _short_child(i):
    pass


def many(n, how):
    """Start `n` short children one after another (os.fork or mp fork Processes), reaping each."""
    n = int(n)
    t0 = time.monotonic()
    codes = 0
    if how == "fork":
        for i in range(n):
            pid = os.fork()
            if pid == 0:
                os._exit(i % 7)
            codes += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    else:
        ctx = mp.get_context("fork")
        for i in range(0, n, 50):              # 50 at a time, as a pool of workers would be
            ps = [ctx.Process(target=_short_child, args=(j,)) for j in range(i, min(n, i + 50))]
            for p in ps:
                p.start()
            for p in ps:
                p.join()
                codes += p.exitcode
    print(f"{n} children, exit codes summed {codes}")
    print(f"seconds {time.monotonic() - t0:.2f}", file=sys.stderr)


def _exit_with(code):
    os._exit(code)


def os_exit(code):
    """A child that ends by os._exit(code+1) (joined), then the program itself by os._exit."""
    code = int(code)
    p = mp.get_context("fork").Process(target=_exit_with, args=(code + 1,))
    p.start()
    p.join()
    print("child exitcode", p.exitcode, flush=True)
    sys.stdout.flush()
    os._exit(code)


def _put_bytes(q):
    q.put(b"x" * 1000)


def old_torch(children="1"):
    """Import whatever torch is on the path (the test's is 1.4.0); each of `children` forked
    children puts bytes on a queue, as a torch program would."""
    import torch
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_put_bytes, args=(q,)) for _ in range(int(children))]
    for p in ps:
        p.start()
    print(torch.__version__, *{len(q.get()) for _ in ps})
    for p in ps:
        p.join()


def sleeper(seconds):
    """Say our pid, then sleep (a program that outlives a killed launcher, or not)."""
    print(os.getpid(), flush=True)
    time.sleep(float(seconds))
    print("woke", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
