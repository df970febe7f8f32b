"""A Pool worker adds up the numbers it gets from a Manager's Queue."""
from multiprocessing import Manager, Pool


def add_up(numbers):
    total = 0
    while True:
        n = numbers.get()
        if n is None:
            break
        total += n
    return total


if __name__ == "__main__":
    with Manager() as manager:
        numbers = manager.Queue()
        with Pool(2) as pool:
            result = pool.apply_async(add_up, (numbers,))
            for n in range(10):
                numbers.put(n)
            print("total:", result.get())
