"""A worker reads a file and sends its bytes back with send_bytes(); the file is not there."""
from multiprocessing import Pipe, Process


def load(path, conn):
    with open(path, "rb") as f:
        conn.send_bytes(f.read())


if __name__ == "__main__":
    here, there = Pipe()
    p = Process(target=load, args=("/nonexistent/weights.bin", there))
    p.start()
    data = here.recv_bytes()
    print(len(data), "bytes")
    p.join()
