"""The same files parsed by a ProcessPoolExecutor: submit() each, never ask for the futures'
results. It ends well -- and parsed nothing."""
from concurrent.futures import ProcessPoolExecutor


def parse(path):
    with open(path) as f:
        return len(f.read())


if __name__ == "__main__":
    with ProcessPoolExecutor(2) as executor:
        for path in ["missing_a.txt", "missing_b.txt"]:
            executor.submit(parse, path)
    print("all files parsed")
