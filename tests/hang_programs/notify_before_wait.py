"""A consumer waits on a Condition for a "ready" flag; the producer notifies -- but forgot to set
the flag, and its notify came before the consumer (started late) began to wait. The consumer
waits for ever, the parent joins it: the lost wake-up."""
import multiprocessing as mp
import time


def consumer(cond, ready):
    time.sleep(0.5)                    # starts late: the notify has already happened
    with cond:
        while not ready.value:
            cond.wait()
    print("consumer saw ready")


if __name__ == "__main__":
    cond = mp.Condition()
    ready = mp.Value("b", 0)
    c = mp.Process(target=consumer, args=(cond, ready))
    c.start()
    with cond:
        cond.notify_all()              # forgot: ready.value = 1
    c.join()
