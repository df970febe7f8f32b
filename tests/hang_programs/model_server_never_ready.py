"""The server process loads its model, then sets `ready`; the parent waits for it before it
sends requests. The model file is missing: the server raises before ready.set()."""
import multiprocessing as mp


def serve(ready, requests):
    with open("model.bin", "rb") as f:          # FileNotFoundError
        weights = f.read()
    ready.set()
    while (req := requests.get()) is not None:
        print(req, len(weights))


if __name__ == "__main__":
    ready, requests = mp.Event(), mp.Queue()
    server = mp.Process(target=serve, args=(ready, requests))
    server.start()
    ready.wait()                                # until the model is loaded
    requests.put("hello")
    requests.put(None)
    server.join()
