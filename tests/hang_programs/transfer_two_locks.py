"""Two clerks move money between two accounts at once; each locks the account it takes from,
then the one it pays into."""
import multiprocessing as mp
import time


def transfer(src, dst, src_lock, dst_lock, amount):
    with src_lock:
        time.sleep(1)               # ask the bank for the balance, check it covers the amount
        with dst_lock:
            src.value -= amount
            dst.value += amount


if __name__ == "__main__":
    a, b = mp.Value("i", 100, lock=False), mp.Value("i", 100, lock=False)
    lock_a, lock_b = mp.Lock(), mp.Lock()
    clerks = [mp.Process(target=transfer, args=(a, b, lock_a, lock_b, 10)),
              mp.Process(target=transfer, args=(b, a, lock_b, lock_a, 20))]
    for c in clerks:
        c.start()
    for c in clerks:
        c.join()
    print(a.value, b.value)
