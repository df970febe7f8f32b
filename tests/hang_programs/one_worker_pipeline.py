"""A pipeline on one worker thread: parse() submits the next stage to the same executor and
waits for it -- but the only worker is running parse()."""
from concurrent.futures import ThreadPoolExecutor

executor = ThreadPoolExecutor(max_workers=1)


def tokenize(text):
    return text.split()


def parse(text):
    tokens = executor.submit(tokenize, text).result()    # waits for the next stage
    return len(tokens)


if __name__ == "__main__":
    print(executor.submit(parse, "a b c").result())
