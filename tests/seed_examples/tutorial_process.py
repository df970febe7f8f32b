# Seed 003 (tutorial), "Process". Changed: the import line only.
import mpviz.multiprocessing as mp
import time

def foo(x):
    print(f"foo({x})")
    time.sleep(2)
    return x

p = mp.Process(target=foo, args=(1,))
p.start()
p.join()
