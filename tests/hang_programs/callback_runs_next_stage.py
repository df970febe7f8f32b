"""Each result's callback submits the next stage to the same Pool and waits for it."""
import multiprocessing as mp


def square(x):
    return x * x


def add_one(x):
    return x + 1


def main():
    with mp.Pool(2) as pool:
        def on_square(y):
            print("stage 2:", pool.apply(add_one, (y,)))   # wait for the next stage here
        results = [pool.apply_async(square, (i,), callback=on_square) for i in range(3)]
        for r in results:
            r.wait()
        pool.close()
        pool.join()


if __name__ == "__main__":
    main()
