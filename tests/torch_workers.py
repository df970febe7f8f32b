"""Real torch programs that tests/test_trace_torch.py runs under ``python -m mpviz trace``.

Each program is an ordinary torch program (nothing of mpviz in it). What the OS says is written
to a JSON file named by argv, so that the test can hold the trace against it: the torch segments
each process maps (``/proc/self/maps``) and, under file_system, the ``/dev/shm/torch_*`` names.

    python torch_workers.py queue STRATEGY OUT.json     ten 256 KiB tensors, producer -> consumer,
                                                        then one small tensor sent twice
    python torch_workers.py hogwild OUT.json            model.share_memory(), two forked trainers
    python torch_workers.py dataloader OUT.json         DataLoader(num_workers=2, pin_memory=True),
                                                        four batches
"""
import json
import os
import sys

import torch
import torch.multiprocessing as mp

N_TENSORS = 10
TENSOR_ELEMS = 65536                    # float32: 256 KiB each
TWICE_ELEMS = 1000                      # the tensor sent twice: 4000 bytes


def torch_maps(pid="self"):
    """The torch segments a process maps, as torch names them: {"/torch_1_2_3": deleted?}."""
    found = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[-1]
            if path.startswith("/dev/shm/torch_"):
                name = path.removeprefix("/dev/shm").removesuffix(" (deleted)")
                found[name] = path.endswith(" (deleted)")
    return found


def dev_shm():
    return sorted("/" + f for f in os.listdir("/dev/shm") if f.startswith("torch_"))


# --- a Queue of tensors ---------------------------------------------------------------------

def produce(q, done):
    for i in range(N_TENSORS):
        q.put(torch.full((TENSOR_ELEMS,), float(i)))
    twice = torch.ones(TWICE_ELEMS)
    q.put(twice)                      # the second time, the receiver has it in torch's cache
    q.put(twice)
    done.wait()                       # the fds are served from here: stay until all are taken


def consume(q, out, done, report):
    got = [q.get() for _ in range(N_TENSORS + 2)]
    report.put({"maps": torch_maps(), "dev_shm": dev_shm(),
                "sums": [float(t.sum()) for t in got], "pid": os.getpid(),
                "same_storage": got[-1].data_ptr() == got[-2].data_ptr()})
    done.set()
    del got


def queue_main(strategy, out):
    mp.set_sharing_strategy(strategy)
    q, report, done = mp.Queue(), mp.Queue(), mp.Event()
    producer = mp.Process(target=produce, args=(q, done), name="producer")
    consumer = mp.Process(target=consume, args=(q, out, done, report), name="consumer")
    producer.start()
    consumer.start()
    seen = report.get(timeout=60)
    producer_maps = torch_maps(producer.pid)
    producer.join()
    consumer.join()
    seen.update(producer=producer.pid, producer_maps=producer_maps)
    with open(out, "w") as f:
        json.dump(seen, f)


# --- Hogwild ----------------------------------------------------------------------------------

def train(rank, model, report):
    torch.manual_seed(rank)
    # plain SGD by hand, in place on the shared parameters (Hogwild: no lock). torch.optim.SGD
    # would do the same, but a process's first optimizer imports ~800 modules (torch._dynamo,
    # sympy): seconds of each trainer's life for nothing this test looks at
    for _ in range(20):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    report.put({"pid": os.getpid(), "maps": torch_maps()})


def hogwild_main(out):
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model.share_memory()
    report = mp.Queue()
    workers = [mp.Process(target=train, args=(r, model, report), name=f"trainer {r}")
               for r in range(2)]
    for w in workers:
        w.start()
    seen = [report.get(timeout=60) for _ in workers]
    for w in workers:
        w.join()
    with open(out, "w") as f:
        json.dump({"workers": seen, "main_maps": torch_maps(),
                   "params": [p.untyped_storage().nbytes() for p in model.parameters()]}, f)


# --- DataLoader ---------------------------------------------------------------------------------

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((1024,), float(i))


def dataloader_main(out):
    # pin_memory=True: with an accelerator, a pin-memory thread pins each batch; a CPU-only
    # torch warns that it will not and runs as with pin_memory=False (what it said is kept)
    import warnings
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        loader = torch.utils.data.DataLoader(Squares(), batch_size=8, num_workers=2,
                                             pin_memory=True)
        sums = [float(b.sum()) for b in loader]
    with open(out, "w") as f:
        json.dump({"sums": sums, "warnings": [str(w.message) for w in said],
                   "accelerator": torch.accelerator.is_available()}, f)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "queue":
        queue_main(sys.argv[2], sys.argv[3])
    elif what == "hogwild":
        hogwild_main(sys.argv[2])
    elif what == "dataloader":
        dataloader_main(sys.argv[2])
    else:
        sys.exit(f"torch_workers.py: unknown program {what!r}; use queue, hogwild or dataloader")
