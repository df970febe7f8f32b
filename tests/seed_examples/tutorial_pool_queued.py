# Seed 003 (tutorial), more tasks than workers. Changed: the import line only (plus `foo`).
import time
import mpviz.multiprocessing as mp

def foo(x, y):
    time.sleep(3)
    return x + y

with mp.Pool(processes=2) as pool:
    for _ in range(3):
        pool.apply_async(foo, (1, 2))
