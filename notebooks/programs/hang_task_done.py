"""A program that hangs: a JoinableQueue's worker forgets one task_done().

q.join() returns when every item put has been marked done. The worker marks all items but the
last one (an off-by-one in its loop), so the count of unfinished tasks never reaches 0 and the
main process waits in q.join() forever.

Run it:   python hang_task_done.py          (hangs; Ctrl-C to stop it)
          python hang_task_done.py --fix    (every item marked done: exits 0)
"""
import multiprocessing as mp
import sys

ITEMS = 5


def work(q, fix):
    for i in range(ITEMS):
        item = q.get()
        _ = item * item                   # the "work"
        if fix or i < ITEMS - 1:          # the bug: the last item is never marked done
            q.task_done()


def main():
    fix = "--fix" in sys.argv[1:]
    q = mp.JoinableQueue()
    worker = mp.Process(target=work, args=(q, fix), daemon=True)
    worker.start()
    for i in range(ITEMS):
        q.put(i)
    q.join()                              # waits until every item is marked done
    print(f"all {ITEMS} items done")
    worker.join()


if __name__ == "__main__":
    main()
