"""Score names in a Pool and record each score with a callback (CPython gh-83371's shape): the
callback fails on one result, in the Pool's result-handler thread, which dies of it -- and
pool.join() waits for ever."""
from multiprocessing import Pool

scores = {}


def score(name):
    return name, len(name)


def record(result):
    name, n = result
    scores[name] = 100 // n          # an empty name: ZeroDivisionError


if __name__ == "__main__":
    pool = Pool(2)
    for name in ["ada", "", "bob"]:
        pool.apply_async(score, (name,), callback=record)
    pool.close()
    pool.join()
    print(scores)
