# Seed 003 (tutorial), "spawn". Changed: the import line only.
import mpviz.multiprocessing as mp

def foo(idx):
    pass

if __name__ == "__main__":
    mp.spawn(foo, args=(), nprocs=4, join=True)
