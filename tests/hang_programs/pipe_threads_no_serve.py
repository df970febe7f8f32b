"""Two threads play ping-pong over a Pipe; the one that serves forgot to send the first ball."""
import threading
from multiprocessing import Pipe


def player(conn, serves):
    if serves:
        pass                                  # meant to be conn.send("ping")
    while True:
        ball = conn.recv()
        conn.send(ball)


if __name__ == "__main__":
    a, b = Pipe()
    alice = threading.Thread(target=player, args=(a, True), name="alice")
    bob = threading.Thread(target=player, args=(b, False), name="bob")
    alice.start()
    bob.start()
    alice.join()
    bob.join()
