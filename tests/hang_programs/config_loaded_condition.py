"""The main thread waits until a loader thread has read the config and notifies it."""
import threading

loaded = threading.Condition()
config = {}


def load():
    text = "port=8080\nhost"              # a line without '='
    with loaded:
        for line in text.splitlines():
            key, value = line.split("=")
            config[key] = value
        loaded.notify_all()


if __name__ == "__main__":
    loader = threading.Thread(target=load, name="loader")
    with loaded:
        loader.start()
        loaded.wait()
    print(config)
