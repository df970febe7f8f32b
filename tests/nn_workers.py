"""Functions that test_nn / test_hogwild child processes run (importable, so spawn can find them)."""
from mpviz.examples.training import train


def train_from_queue(inbox, outbox, **train_kwargs):
    """Receive a model, train it in place, report the type and sharing state of what arrived."""
    model = inbox.get()
    kinds = sorted({type(p).__name__ for p in model.parameters()})
    shared = all(p.is_shared() for p in model.parameters())
    train(model, **train_kwargs)
    outbox.put((kinds, shared))


def receive_and_report(inbox, outbox):
    """Receive a tensor; send back its values and whether it requires grad."""
    t = inbox.get()
    outbox.put((t.tolist(), t.requires_grad))


def add_to_grads(model, value):
    """Add `value` to every existing .grad of `model` in place (they are shared if the parent shared them)."""
    for p in model.parameters():
        p.grad.add_(value)
