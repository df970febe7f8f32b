"""A task raises an exception whose class cannot be rebuilt from its args (CPython gh-103061):
the Pool's result handler thread dies unpickling it, and map() waits for ever."""
import multiprocessing


class MyExc(Exception):
    def __init__(self, stuff):
        super().__init__(stuff.two)


class Stuff:
    def __init__(self):
        self.one = 1
        self.two = 2


def run(_):
    raise MyExc(Stuff())


if __name__ == "__main__":
    with multiprocessing.Pool(3) as pool:
        pool.map(run, [1])
