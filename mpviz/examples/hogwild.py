"""The Hogwild example from torch's "Multiprocessing best practices", running on mpviz.

Run it: ``python -m mpviz.examples.hogwild``. The code below is the example as the notes print it,
with two changes: the imports (``mpviz.multiprocessing`` for ``torch.multiprocessing``, mpviz's
model), and the lines the notes leave to you under "Construct data_loader, optimizer, etc.".
Around the example, two prints show that the shared model learned.

Try: comment out ``model.share_memory()``. Under the ``fork`` start method (Linux's default
before Python 3.14) the final accuracy stays at chance: each child trained its own copy-on-write
copy of the parameters, and the parent's never changed.
"""
import mpviz.multiprocessing as mp
from mpviz import nn, optim
from mpviz.examples import data as blobs
from mpviz.examples.model import MyModel
from mpviz.examples.training import accuracy


def train(model):
    # Construct data_loader, optimizer, etc.
    data_loader = blobs.data_loader(*blobs.make_blobs(), batch_size=32)
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.functional.cross_entropy
    for data, labels in data_loader:
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()  # This will update the shared parameters


if __name__ == '__main__':
    num_processes = 4
    model = MyModel()
    test_data, test_labels = blobs.make_blobs(1000, seed=1)
    print(f"start method {mp.get_start_method()}: accuracy before training "
          f"{accuracy(model, test_data, test_labels):.1%}")
    # NOTE: this is required for the ``fork`` method to work
    model.share_memory()
    processes = []
    for rank in range(num_processes):
        p = mp.Process(target=train, args=(model,))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print(f"accuracy after {num_processes} Hogwild workers: "
          f"{accuracy(model, test_data, test_labels):.1%}")
