"""What CUDA IPC does, seen from a program: run me with `torch` or with `mpviz`, compare the facts.

    python tests/cuda_oracle.py torch rules            # the real thing: torch.multiprocessing
    python tests/cuda_oracle.py mpviz rules            # the same program, `import mpviz as torch`
    python tests/cuda_oracle.py torch producer-exits   # the warning, without the seed's race

`rules` prints one JSON object of facts that do not depend on the library's own names (no
pointers, no pids, no class names), so tests/test_cuda.py can assert the two are equal. Each fact
is one rule of torch's "Sharing CUDA tensors" note:

* shared:        a CUDA tensor is always shared (``is_shared()``), sharing it again is a no-op;
* storage_alone: a CUDA storage on its own is refused, with torch's message (mpviz's goes on to
                 say why and how to fix it);
* same_block:    a consumer that gets `x` and `x[1:]` maps one block: their pointers are 4 bytes
                 apart, as in the producer;
* writes_back:   the consumer's in-place write is seen by the producer (the memory is the same);
* resend:        a received tensor is refused on another queue, with torch's message; its clone
                 travels.

`producer-exits` is the seed's bad-practice example made deterministic: the producer returns only
once the consumer has the tensor (an Event, where the seed sleeps 2 s), so torch's warning
"Producer process has been terminated before all shared CUDA tensors released" must appear on
stderr. (The seed itself races: on an H100 with torch 2.11, torch printed it in 1 of 4 runs.)
"""
import importlib
import json
import sys


def consumer(name, q, back, out, done):
    T = importlib.import_module(name)
    importlib.import_module(f"{name}.multiprocessing")
    a, b = q.get(), q.get()
    out.put(("same_block", b.data_ptr() - a.data_ptr()))
    a.fill_(7.0)
    T.cuda.synchronize()            # the write is done on the device before we say so
    try:
        back.put(a)
        out.put(("resend", "sent"))
    except RuntimeError as e:
        out.put(("resend", str(e)))
    back.put(a.clone())
    out.put(("wrote", True))
    del a, b
    done.wait()


def producer(name, q, got):
    T = importlib.import_module(name)
    importlib.import_module(f"{name}.multiprocessing")
    x = T.ones(4).cuda()
    q.put(x)
    got.wait()                      # the consumer holds x now; return (and exit) anyway


def holder(name, q, got, producer_gone):
    importlib.import_module(f"{name}.multiprocessing")
    x = q.get()
    got.set()
    producer_gone.wait()
    del x                           # too late: the producer has warned and freed the block


def producer_exits(name):
    ctx = importlib.import_module(f"{name}.multiprocessing").get_context("spawn")
    q, got, gone = ctx.Queue(), ctx.Event(), ctx.Event()
    prod = ctx.Process(target=producer, args=(name, q, got))
    cons = ctx.Process(target=holder, args=(name, q, got, gone))
    prod.start()
    cons.start()
    prod.join(60)
    gone.set()
    cons.join(60)
    _kill_if_alive(prod, cons)
    print(json.dumps({"exitcodes": [prod.exitcode, cons.exitcode]}))


def _kill_if_alive(*processes):
    """A process still running after its 60 s is stuck: kill it, so that nothing outlives us
    (the test then sees exit code -9 instead of 0)."""
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()


def rules(name):
    T = importlib.import_module(name)
    mp = importlib.import_module(f"{name}.multiprocessing")
    ctx = mp.get_context("spawn")
    facts = {}
    x = T.ones(4).cuda()
    facts["shared"] = [x.is_shared(), x.share_memory_() is x]
    try:
        ctx.SimpleQueue().put(x.untyped_storage())
        facts["storage_alone"] = "sent"
    except RuntimeError as e:
        facts["storage_alone"] = str(e)
    q, back, out, done = ctx.Queue(), ctx.SimpleQueue(), ctx.Queue(), ctx.Event()
    p = ctx.Process(target=consumer, args=(name, q, back, out, done))
    p.start()
    q.put(x)
    q.put(x[1:])
    facts["same_block"] = out.get(timeout=60)[1]
    facts["resend"] = out.get(timeout=60)[1]
    clone = back.get()
    out.get(timeout=60)
    facts["writes_back"] = x.cpu().tolist()
    facts["clone"] = clone.cpu().tolist()
    del clone
    done.set()
    p.join(60)
    _kill_if_alive(p)
    facts["exitcode"] = p.exitcode
    print(json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    {"rules": rules, "producer-exits": producer_exits}[sys.argv[2]](sys.argv[1])
