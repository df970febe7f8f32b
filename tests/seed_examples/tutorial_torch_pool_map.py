# Seed 003 (tutorial), the same map with torch.multiprocessing. Changed: the import line only.
import mpviz.multiprocessing as mp
import time

def foo(x):
    print(f"Starting foo({x})")
    time.sleep(2)
    return x

with mp.Pool(processes=2) as pool:
    result = pool.map(foo, range(10), chunksize=None)
    print(result)
