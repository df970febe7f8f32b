"""DataLoader's shuffle= and sampler=, as torch users pass them: one program, run on
torch.utils.data and on mpviz.utils.data side by side (real torch, real forked workers).

Where the order is fixed (a sampler: a list, a DistributedSampler with its seed) the batches must
be torch's, index for index. shuffle=True draws a new order each epoch from the process's random
numbers, in torch from torch's generator, in mpviz from mpviz's: the orders differ between the
libraries, so what must hold is what a RandomSampler promises -- each epoch every sample once, a
new order each epoch, the same orders again after the same manual_seed.
"""
import mpviz
import mpviz.utils.data as mpviz_data
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data as torch_data  # noqa: E402

pytestmark = pytest.mark.timeout(60)

SAMPLES = list(range(100, 120))          # a map-style data set of 20 numbers


def _epochs(data, loader, n=2):
    """The batches (lists of numbers) of `n` epochs of `loader`."""
    out = []
    for epoch in range(n):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        out.append([[int(x) for x in batch.tolist()] for batch in loader])
    return out


def program(data, workers):
    """What a torch user writes, for one library's `data` module."""
    ranked = data.DistributedSampler(SAMPLES, num_replicas=2, rank=1, shuffle=True, seed=3)
    picked = data.DataLoader(SAMPLES, batch_size=3, sampler=[5, 0, 19, 3, 3], drop_last=True,
                             num_workers=workers)
    sharded = data.DataLoader(SAMPLES, batch_size=3, sampler=ranked, num_workers=workers)
    try:
        data.DataLoader(SAMPLES, batch_size=3, shuffle=True, sampler=ranked)
        refused = None
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    return {"picked": _epochs(data, picked), "len picked": len(picked),
            "sharded": _epochs(data, sharded), "len sharded": len(sharded),
            "len shuffled": len(data.DataLoader(SAMPLES, 3, True, drop_last=True)),
            "refused": refused}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_gives_torchs_batches_and_shuffle_with_a_sampler_torchs_error(workers):
    ours, theirs = program(mpviz_data, workers), program(torch_data, workers)
    assert ours == theirs
    assert theirs["refused"] == "ValueError: sampler option is mutually exclusive with shuffle"
    assert theirs["picked"][0] == [[105, 100, 119]]


def _shuffled(data, seed, manual_seed, workers=2):
    manual_seed(seed)
    loader = data.DataLoader(SAMPLES, 3, True, num_workers=workers)     # shuffle, by position
    return _epochs(data, loader, 3)


@pytest.mark.parametrize("data, manual_seed", [(mpviz_data, mpviz.manual_seed),
                                               (torch_data, torch.manual_seed)],
                         ids=["mpviz", "torch"])
def test_shuffle_reads_every_sample_once_in_a_new_order_each_epoch(data, manual_seed):
    epochs = _shuffled(data, 7, manual_seed)
    orders = [[x for batch in epoch for x in batch] for epoch in epochs]
    for epoch, order in zip(epochs, orders):
        assert sorted(order) == SAMPLES                        # every sample, once
        assert [len(b) for b in epoch] == [3] * 6 + [2]
    assert len({tuple(o) for o in orders + [SAMPLES]}) == 4    # new each epoch; not in order
    assert _shuffled(data, 7, manual_seed) == epochs           # the same seed: the same orders
