"""A thread waits for a ready signal that the main thread forgets to give."""
import threading

ready = threading.Event()


def serve():
    ready.wait()
    print("serving", flush=True)


if __name__ == "__main__":
    t = threading.Thread(target=serve)
    t.start()
    t.join()
