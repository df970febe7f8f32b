"""Scale images in a Pool; one task takes more memory than the machine has, and the kernel's
out-of-memory killer ends its worker with SIGKILL (here the task sends it itself: the same end,
without filling the machine's memory)."""
import os
import signal
from multiprocessing import Pool


def scale(size):
    if size > 1000:
        os.kill(os.getpid(), signal.SIGKILL)      # what the OOM killer would do
    return size // 2


if __name__ == "__main__":
    with Pool(2) as pool:
        print(pool.map(scale, [10, 20, 4000, 30]))
