"""A collector thread joins the parser thread; the parser waits for lines the main thread
reads from a slow source (20 s) and then puts."""
import queue
import threading
import time


def parse(q, out):
    while (line := q.get()) is not None:
        out.append(line.split())


def collect(parser, q, out):
    q.put("header line")
    parser.join()
    print(len(out), "lines parsed", flush=True)


if __name__ == "__main__":
    q, out = queue.Queue(), []

    parser = threading.Thread(target=parse, args=(q, out))
    collector = threading.Thread(target=collect, args=(parser, q, out))
    parser.start()
    collector.start()
    time.sleep(20)                     # the slow source
    q.put("a b c")
    q.put(None)
    collector.join()
