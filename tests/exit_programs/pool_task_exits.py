"""Square numbers in a Pool; a bad input makes the task stop its process (bpo-22393).

``python pool_task_exits.py sys`` stops with ``sys.exit(1)``, ``... os`` with ``os._exit(1)``.
"""
import os
import sys
from multiprocessing import Pool

HOW = sys.argv[1] if len(sys.argv) > 1 else "sys"


def square(x):
    if x < 0:
        if HOW == "os":
            os._exit(1)       # "cannot happen": stop right here
        sys.exit(1)
    return x * x


if __name__ == "__main__":
    with Pool(2) as pool:
        print(pool.map(square, [1, 2, -3, 4]))
