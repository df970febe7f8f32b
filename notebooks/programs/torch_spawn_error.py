"""Notebook 07's program in real torch: three ranks under torch.multiprocessing.spawn, and rank 1
raises at its third step of work. A plain torch script; it knows nothing of mpviz.

    python torch_spawn_error.py

spawn watches all ranks at once: when rank 1 exits with its traceback in its error pipe, it
SIGTERMs ranks 0 and 2 and raises ProcessRaisedException here, in the parent.
"""
import time

import torch.multiprocessing as mp

# 50 steps: the others never reach their last, SIGTERMed at rank 1's failure even when a busy
# machine starts rank 1 seconds after them
NPROCS, FAILING_RANK, STEPS = 3, 1, 50


def work(rank, failing_rank, steps):
    for i in range(steps):
        if rank == failing_rank and i == 2:
            raise ValueError(f"boom from rank {rank}")
        time.sleep(0.1)                  # a step of work


def main():
    try:
        mp.spawn(work, args=(FAILING_RANK, STEPS), nprocs=NPROCS, join=True)
    except mp.ProcessRaisedException as exc:
        print(f"{type(exc).__name__} from rank {exc.error_index} (pid {exc.error_pid}); "
              f"its last line: {str(exc).strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
