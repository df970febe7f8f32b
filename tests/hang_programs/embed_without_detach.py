"""Workers embed their shard with the model and send the embeddings back. The output of a
model is a non-leaf tensor that requires grad: torch refuses to share it -- in the queue's
feeder thread, after put() has returned."""
import torch
import torch.multiprocessing as mp


def embed(model, shard, q):
    q.put(model(shard))                      # forgot .detach()


if __name__ == "__main__":
    model = torch.nn.Linear(8, 4)
    model.share_memory()
    q = mp.Queue()
    shards = torch.randn(2, 16, 8)
    workers = [mp.Process(target=embed, args=(model, shards[i], q)) for i in range(2)]
    for w in workers:
        w.start()
    embeddings = [q.get() for _ in workers]
    for w in workers:
        w.join()
    print(torch.cat(embeddings).shape)
