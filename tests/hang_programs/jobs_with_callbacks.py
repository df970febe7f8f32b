"""Each job goes on a JoinableQueue with the function to call with its result; a worker runs
the jobs and marks each done. The main process waits with q.join() for all of them."""
import multiprocessing as mp


def run_jobs(jobs):
    while True:
        number, on_done = jobs.get()
        on_done(number * number)
        jobs.task_done()


if __name__ == "__main__":
    jobs = mp.JoinableQueue()
    worker = mp.Process(target=run_jobs, args=(jobs,), daemon=True)
    worker.start()
    for n in range(3):
        jobs.put((n, lambda result: print("result", result)))
    jobs.join()
    print("all jobs done")
