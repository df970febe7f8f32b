# Seed 003 (tutorial), apply_async with a callback. Changed: the import line only (plus `foo`
# from the previous snippet). With the stdlib, leaving the `with` block terminates the pool and
# these callbacks never run; mpviz waits for the tasks (and warns), so the text's output appears.
import time
import mpviz.multiprocessing as mp

def foo(x, y):
    time.sleep(3)
    return x + y

def callback(result):
    print(f"Got result: {result}")

with mp.Pool(processes=4) as pool:
    handle1 = pool.apply_async(foo, (1, 2), callback=callback)
    handle2 = pool.apply_async(foo, (3, 4), callback=callback)
