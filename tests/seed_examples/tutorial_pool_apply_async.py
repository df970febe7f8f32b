# Seed 003 (tutorial), "apply_async". Changed: the import line only (the snippet continues the
# previous one, so its `foo` is repeated here).
import time
import mpviz.multiprocessing as mp

def foo(x, y):
    time.sleep(3)
    return x + y

with mp.Pool(processes=4) as pool:
    handle1 = pool.apply_async(foo, (1, 2))
    handle2 = pool.apply_async(foo, (3, 4))

    a = handle1.get()
    b = handle2.get()

    print(a, b)
