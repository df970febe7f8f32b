"""The main process hands a worker its tasks, each with the open log file to append to, and a
None to stop; the worker runs them. The program ends well -- and no task was run."""
import multiprocessing as mp


def worker(tasks):
    while True:
        task = tasks.get()
        if task is None:
            break
        name, log = task
        log.write(f"{name} done\n")


if __name__ == "__main__":
    tasks = mp.Queue()
    w = mp.Process(target=worker, args=(tasks,))
    w.start()
    with open("run.log", "a") as log:
        for name in ["resize", "crop"]:
            tasks.put((name, log))
        tasks.put(None)
        w.join()
    print("all tasks sent")
