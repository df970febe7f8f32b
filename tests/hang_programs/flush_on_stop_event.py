"""A watcher thread waits for a stop event to flush its log; the main thread ends without
setting it."""
import threading

stop = threading.Event()


def watcher():
    stop.wait()
    print("flushing")


threading.Thread(target=watcher, name="watcher").start()
print("main done")
