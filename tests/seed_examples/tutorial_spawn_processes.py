# Seed 003 (tutorial), "spawn", the hand-written version it improves on. Changed: the import line
# only. (It builds a list of one process although it sets num_proc = 4: the tutorial's code.)
import mpviz.multiprocessing as mp

def foo():
    pass

if __name__ == "__main__":
    num_proc = 4
    processes = [mp.Process(target=foo)]
    for proc in processes:
        proc.start()
    for proc in processes:
        proc.join()
