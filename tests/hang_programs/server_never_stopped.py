"""A worker process serves requests from a queue until it is told to stop -- which the program
forgets. The main process sends its requests and ends."""
import multiprocessing as mp


def serve(requests):
    while True:
        r = requests.get()
        print("served", r)


if __name__ == "__main__":
    requests = mp.Queue()
    mp.Process(target=serve, args=(requests,)).start()
    for r in range(3):
        requests.put(r)
    print("main done")
