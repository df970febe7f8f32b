"""Square numbers in a Pool and keep some settings in a Manager; neither is closed: the
interpreter's exit ends them."""
from multiprocessing import Manager, Pool


def square(x):
    return x * x


if __name__ == "__main__":
    pool = Pool(2)
    squares = pool.map(square, range(10))
    settings = Manager().dict(rounds=3)
    print(f"collected {len(squares)} squares, {settings['rounds']} rounds")
