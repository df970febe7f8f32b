"""A reader thread parses lines into a bounded queue.Queue; the writer thread stops at a bad line
(it raises), and the reader blocks on the full queue; the main thread joins the reader."""
import queue
import threading


def read(lines, q):
    for line in lines:
        q.put(line.upper())
    q.put(None)


def write(q):
    while (line := q.get()) is not None:
        if line.startswith("BAD"):
            raise ValueError(f"cannot write {line!r}")
        print(line, flush=True)


if __name__ == "__main__":
    q = queue.Queue(maxsize=2)
    lines = ["a", "b", "bad c", "d", "e", "f"]
    reader = threading.Thread(target=read, args=(lines, q))
    writer = threading.Thread(target=write, args=(q,))
    reader.start()
    writer.start()
    reader.join()
    writer.join()
