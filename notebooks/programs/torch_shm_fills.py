"""How /dev/shm fills with torch_* files under torch's file_system strategy (pitfall #11).

Two ways, both in real torch, no switch turned off:

    1. handles never received   put() gives each tensor a file in /dev/shm and counts one
                                reference for the handle in flight; the get() that would
                                take that reference never comes, so the file stays, although
                                the sender dropped its tensors.
    2. a consumer killed        a consumer holds tensors it received and is killed with SIGKILL
       with SIGKILL             (the OOM killer, kill -9): it never lets go of its references,
                                so the files stay, although the producer dropped its tensors.

Both stay until torch_shm_manager sweeps: it unlinks what its clients left only once *all* of
them have exited, that is at the end of the whole job. A long job fills /dev/shm meanwhile.

Run it:   python torch_shm_fills.py
It prints, at each step, how many torch_* files in /dev/shm this job made, and their names last
(notebook 03 watches them disappear after the job).
"""
import glob
import os
import signal

import torch
import torch.multiprocessing as mp

N, ELEMENTS = 3, 256 * 1024                # 3 tensors of 1 MiB each


def ours():
    """The torch_* files in /dev/shm that this job made (their names hold the maker's pid)."""
    pids = {os.getpid()} | {p.pid for p in mp.active_children()}
    return sorted(f for f in glob.glob("/dev/shm/torch_*")
                  if int(os.path.basename(f).split("_")[1]) in pids | ours.pids)


ours.pids = set()


def hold(q, ready):
    kept = [q.get() for _ in range(N)]     # keeps references to all three files
    ready.set()
    signal.pause()                         # until it is killed
    del kept


def main():
    mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("fork")

    # 1. put, and nobody gets
    q = ctx.Queue()
    sent = [torch.ones(ELEMENTS) for _ in range(N)]
    for t in sent:
        q.put(t)
    q.close()
    q.join_thread()                        # every handle is in the pipe now
    del sent, t
    print(f"1. {N} tensors put, never received, the sender's tensors deleted: "
          f"{len(ours())} torch_* files left in /dev/shm", flush=True)

    # 2. a consumer that holds what it got is killed with SIGKILL
    q, ready = ctx.Queue(), ctx.Event()
    consumer = ctx.Process(target=hold, args=(q, ready))
    consumer.start()
    ours.pids.add(consumer.pid)
    sent = [torch.ones(ELEMENTS) for _ in range(N)]
    for t in sent:
        q.put(t)
    ready.wait(60)
    os.kill(consumer.pid, signal.SIGKILL)
    consumer.join()
    del sent, t
    left = ours()
    print(f"2. a consumer received {N} more and was killed with SIGKILL, the producer deleted "
          f"its tensors: {len(left)} torch_* files left ({N} of step 1, {N} the dead consumer "
          f"held)", flush=True)
    print("the job ends now; torch_shm_manager sweeps what its clients left", flush=True)
    print("files:", " ".join(left), flush=True)


if __name__ == "__main__":
    main()
