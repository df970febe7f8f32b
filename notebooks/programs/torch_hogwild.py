"""Notebook 08's program in real torch: Hogwild, as PyTorch's notes and pytorch/examples'
mnist_hogwild write it, but tiny: two workers train one shared model on four clouds of points.
A plain torch.multiprocessing script; it knows nothing of mpviz.

    python torch_hogwild.py

It runs the example twice, with the default start method (fork before Python 3.14) as the
example does: first the trap, without ``model.share_memory()``, then as written. The parent
measures its own model only after both rounds: only what reached its parameters counts. (Not
before the workers start: measured there, this script's forked workers hung in torch's native
code, as the verdict of ``mpviz trace`` showed: notebook 04's pitfall. The example measures after
join too.)
"""
import torch
import torch._dynamo  # noqa: F401  what a worker's first optimizer would import (some 800
import torch.multiprocessing as mp   # modules): imported once here, inherited by every fork
import torch.nn as nn
import torch.nn.functional as F

CENTERS = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])


def blobs(n, seed):
    """n points around four centres, the class of each: an easy 4-class problem."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    return CENTERS[labels] + 0.8 * torch.randn(n, 2, generator=g), labels


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(2, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(F.relu(self.hidden(x)))


def train(model, rank, epochs=1):
    # Construct data_loader, optimizer, etc.
    data, labels = blobs(256, seed=rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for i in range(0, len(data), 32):
            optimizer.zero_grad()
            F.cross_entropy(model(data[i:i + 32]), labels[i:i + 32]).backward()
            optimizer.step()  # This will update the shared parameters


def accuracy(model, data, labels):
    with torch.no_grad():
        return (model(data).argmax(1) == labels).float().mean().item()


def hogwild(share, num_processes=2):
    """The example's main: a fresh model, its workers; returns the model and its exit codes."""
    torch.manual_seed(0)
    model = MyModel()
    if share:
        # NOTE: this is required for the ``fork`` method to work
        model.share_memory()
    processes = []
    for rank in range(num_processes):
        p = mp.Process(target=train, args=(model, rank))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    return model, [p.exitcode for p in processes]


if __name__ == "__main__":
    runs = {share: hogwild(share) for share in (False, True)}
    torch.manual_seed(0)
    untrained = MyModel()                # the same start as each round's model
    test_x, test_y = blobs(1000, seed=99)
    for share, (model, exitcodes) in runs.items():
        changed = any(not torch.equal(a, b)
                      for a, b in zip(untrained.parameters(), model.parameters()))
        print(f"share_memory()={share} under {mp.get_start_method()}: exit codes {exitcodes}; "
              f"the parent's parameters changed: {changed}; its accuracy "
              f"{accuracy(untrained, test_x, test_y):.1%} -> {accuracy(model, test_x, test_y):.1%}")
