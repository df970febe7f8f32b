"""Square numbers in a Pool, in the background; collect the results when they are needed."""
import time
from multiprocessing import Pool


def slow_square(x):
    time.sleep(2)                   # a slow computation
    return x * x


if __name__ == "__main__":
    with Pool(4) as pool:
        result = pool.map_async(slow_square, range(8))
    print("doing other work meanwhile ...")
    print(result.get())
