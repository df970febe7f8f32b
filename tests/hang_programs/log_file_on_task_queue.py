"""The main process hands a worker its task together with the open log file to append to;
then it waits for the worker to finish."""
import multiprocessing as mp


def worker(tasks):
    name, log = tasks.get()
    log.write(f"{name} done\n")


if __name__ == "__main__":
    tasks = mp.Queue()
    w = mp.Process(target=worker, args=(tasks,))
    w.start()
    with open("run.log", "a") as log:
        tasks.put(("resize", log))
        w.join()
