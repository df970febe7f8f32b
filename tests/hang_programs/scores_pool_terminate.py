"""Score the documents in a Pool; no more work will be sent, so the pool is stopped before the
scores are read."""
import time
from multiprocessing import Pool


def score(doc):
    time.sleep(2)                   # run the model on the document
    return len(doc)


if __name__ == "__main__":
    docs = ["first doc", "second doc", "third doc", "fourth doc"]
    pool = Pool(2)
    scores = pool.map_async(score, docs)
    pool.terminate()                # no more work for the pool
    pool.join()
    print(scores.get())
