"""A program that hangs: a child forked after torch used several OpenMP threads (pytorch#17199).

The parent multiplies two matrices with ``torch.einsum`` on 2 threads: torch's CPU kernels run
on an OpenMP thread pool (GNU libgomp), whose threads stay alive, waiting for the next job.
Then it forks a child. fork copies memory, not threads: the child inherits libgomp's idea that
its pool exists, but not the pool's threads. The child's first ``torch.einsum`` hands work to
threads it does not have, and waits for them for ever (a futex wait, in native code: Python
cannot interrupt it, and its stack shows only the line that called einsum).

Run it:   python hang_torch_fork.py          (hangs; Ctrl-C to stop)
          python hang_torch_fork.py --fix    (torch.set_num_threads(1) before forking: exits 0)
"""
import multiprocessing as mp
import sys

import torch


def features(n):
    x = torch.randn(n, n)
    y = torch.einsum("ij,jk->ik", x, x)
    print(f"child: features {tuple(y.shape)}", flush=True)


def main():
    fix = "--fix" in sys.argv[1:]
    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    print(f"parent: {torch.einsum('ij,jk->ik', x, x).shape} on {torch.get_num_threads()} "
          f"threads", flush=True)
    if fix:
        torch.set_num_threads(1)
    child = mp.get_context("fork").Process(target=features, args=(256,))
    child.start()
    child.join()
    print(f"child exit code {child.exitcode}", flush=True)


if __name__ == "__main__":
    main()
