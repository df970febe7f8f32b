"""A server and its client, with the multiprocessing docs' Listener and Client: the server waits
for the client's request, and the client waits for the server's greeting first."""
import sys
from multiprocessing import Process
from multiprocessing.connection import Client, Listener

AUTHKEY = b"secret password"


def ask(address):
    with Client(address, authkey=AUTHKEY) as conn:
        print("server says:", conn.recv(), flush=True)      # its greeting
        conn.send("hello")
        print("answer:", conn.recv(), flush=True)


if __name__ == "__main__":
    family = sys.argv[1] if len(sys.argv) > 1 else "AF_INET"
    address = ("localhost", 0) if family == "AF_INET" else None
    with Listener(address, family, authkey=AUTHKEY) as listener:
        client = Process(target=ask, args=(listener.address,))
        client.start()
        with listener.accept() as conn:
            print("connection accepted from", listener.last_accepted, flush=True)
            request = conn.recv()
            conn.send(request.upper())
        client.join()
