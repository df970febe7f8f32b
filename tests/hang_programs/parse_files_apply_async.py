"""Each file is parsed in a Pool; the workers store what they parse themselves, so the program
never asks apply_async for the results. It ends well -- and parsed nothing."""
from multiprocessing import Pool


def parse(path):
    with open(path) as f:
        return len(f.read())


if __name__ == "__main__":
    with Pool(2) as pool:
        for path in ["missing_a.txt", "missing_b.txt"]:
            pool.apply_async(parse, (path,))
        pool.close()
        pool.join()
    print("all files parsed")
