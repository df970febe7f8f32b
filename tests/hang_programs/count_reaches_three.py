"""A consumer waits, with Condition.wait_for, until the count reaches 3; the producer adds 2,
notifying each time."""
import multiprocessing as mp


def consume(cond, count):
    with cond:
        cond.wait_for(lambda: count.value >= 3)
    print("got 3", flush=True)


if __name__ == "__main__":
    cond, count = mp.Condition(), mp.Value("i", 0)
    c = mp.Process(target=consume, args=(cond, count))
    c.start()
    for _ in range(2):
        with cond:
            count.value += 1
            cond.notify_all()
    c.join()
