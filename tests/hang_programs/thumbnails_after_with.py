"""Make a thumbnail of each image in a Pool; collect the sizes once every job is submitted."""
import time
from multiprocessing import Pool


def make_thumbnail(name):
    time.sleep(2)                   # decode, resize, encode
    return name, 128 * 128


if __name__ == "__main__":
    images = ["a.png", "b.png", "c.png", "d.png"]
    with Pool(2) as pool:
        pending = [pool.apply_async(make_thumbnail, (name,)) for name in images]
    sizes = dict(r.get() for r in pending)
    print(sizes)
