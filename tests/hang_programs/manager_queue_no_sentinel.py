"""A worker pulls jobs from a Manager's queue until it gets None; the parent puts the jobs after
starting it, then joins it -- and forgot the None."""
from multiprocessing import Manager, Process


def work(jobs, done):
    while (job := jobs.get()) is not None:
        done.append(job * 2)


if __name__ == "__main__":
    with Manager() as manager:
        jobs, done = manager.Queue(), manager.list()
        p = Process(target=work, args=(jobs, done))
        p.start()
        for n in range(3):
            jobs.put(n)
        p.join()
        print(list(done))
