"""A bank account whose deposit() logs the balance through a method that takes the same lock."""
import threading


class Account:
    def __init__(self):
        self.lock = threading.Lock()
        self.balance = 0

    def report(self):
        with self.lock:
            print("balance", self.balance, flush=True)

    def deposit(self, amount):
        with self.lock:
            self.balance += amount
            self.report()


if __name__ == "__main__":
    acct = Account()
    workers = [threading.Thread(target=acct.deposit, args=(10,)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
