# Seed 003 (tutorial), starmap. Changed: the import line only (plus `import time`, which the
# snippet takes from the previous one).
import mpviz.multiprocessing as mp
import time

def bar(x, y):
    print(f"Starting bar({x}, {y})")
    time.sleep(2)
    return x + y

with mp.Pool(processes=2) as pool:
    pool.starmap(bar, [(1, 2), (3, 4), (5, 6)])
