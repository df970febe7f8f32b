"""Workers make thumbnails of images taken from a JoinableQueue; the main process waits with
q.join() until every image is done, then stops them. The workers never call task_done()."""
import multiprocessing as mp


def make_thumbnails(images):
    while True:
        name = images.get()
        if name is None:
            break
        print("thumbnail of", name)


if __name__ == "__main__":
    images = mp.JoinableQueue()
    workers = [mp.Process(target=make_thumbnails, args=(images,)) for _ in range(2)]
    for w in workers:
        w.start()
    for name in ["a.png", "b.png", "c.png"]:
        images.put(name)
    images.join()                       # until every image is done
    for w in workers:
        images.put(None)
    for w in workers:
        w.join()
    print("all thumbnails made")
