"""Save records in a Pool, fire and forget, then close and join it; a bad record makes the
task stop its process (bpo-22393: the Pool waits for that job for ever, and join() with it).
"""
import os
from multiprocessing import Pool


def save(record):
    if record < 0:
        os._exit(1)          # "cannot happen": stop right here
    return record


if __name__ == "__main__":
    pool = Pool(2)
    for record in [1, 2, -3, 4]:
        pool.apply_async(save, (record,))
    pool.close()
    pool.join()
    print("all saved")
