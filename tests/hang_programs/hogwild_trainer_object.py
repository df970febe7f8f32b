"""Hogwild training with the model kept in a Trainer object, each worker process running the
trainer's train() -- the `model.share_memory()` line forgotten (pass `share` to keep it)."""
import sys

import torch
import torch.multiprocessing as mp
import torch.nn as nn


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.lr = lr

    def train(self, steps):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        for _ in range(steps):
            optimizer.zero_grad()
            loss = self.model(torch.ones(8, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    mp.set_start_method("fork")
    trainer = Trainer(nn.Linear(4, 1), lr=0.1)
    if sys.argv[1:] == ["share"]:
        trainer.model.share_memory()
    before = trainer.model.weight.detach().clone()
    processes = [mp.Process(target=trainer.train, args=(20,)) for _ in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("the model learned:", not torch.equal(before, trainer.model.weight))
