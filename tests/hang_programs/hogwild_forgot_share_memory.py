"""Hogwild training as pytorch/examples' mnist_hogwild does it -- with its
`model.share_memory()` line forgotten (pass `share` to keep it). Each worker trains the model
it was given; the main process checks whether its model learned."""
import sys

import torch
import torch.multiprocessing as mp
import torch.nn as nn


def train(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        optimizer.zero_grad()
        loss = model(torch.ones(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    mp.set_start_method("fork")
    model = nn.Linear(4, 1)
    if sys.argv[1:] == ["share"]:
        model.share_memory()
    before = model.weight.detach().clone()
    processes = [mp.Process(target=train, args=(model,)) for _ in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("the model learned:", not torch.equal(before, model.weight))
