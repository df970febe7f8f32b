"""One contender's driver: a process with a queue to an echo child, timing round trips on command.

``bench.run`` starts one driver per contender (``python -m bench.handoff CONTENDER``) and then asks
them in turn — one batch each, round after round — so that every contender sees the same machine
load. A driver answers each command with one JSON line::

    orchestrator ──"rt shared 1048576 20"──▶ driver ── put ─▶ [queue] ─▶ echo child
                 ◀── {"times": [...]} ──────        ◀─ get ── [queue] ◀── put back

* ``rt shared SIZE N``: N round trips of one tensor that is already in shared memory (the handle
  travels; the bytes do not).
* ``rt fresh SIZE N``: N round trips, each of a brand-new tensor (made before the clock starts):
  the put moves its bytes into shared memory — that copy, into fresh or reused pages, is the cost.
* ``startup N``: N times, start two processes running an empty function and join them.

The echo child takes what arrives, puts it back, and drops its reference (``q2.put(q1.get())``),
as in the measurements of issue #8.
"""
import json
import os
import sys
import time

import numpy as np

CONTENDERS = {
    # name: (library, start method, sharing strategy, shared-memory cache bytes)
    "mpviz fd fork": ("mpviz", "fork", "file_descriptor", 0),
    "mpviz fs fork": ("mpviz", "fork", "file_system", 0),
    "mpviz fd spawn": ("mpviz", "spawn", "file_descriptor", 0),
    "mpviz fs spawn": ("mpviz", "spawn", "file_system", 0),
    "mpviz fd fork +cache": ("mpviz", "fork", "file_descriptor", 256 << 20),
    "mpviz fs fork +cache": ("mpviz", "fork", "file_system", 256 << 20),
    "torch fd fork": ("torch", "fork", "file_descriptor", 0),
    "torch fs fork": ("torch", "fork", "file_system", 0),
    "stdlib Queue+pickle": ("stdlib-queue", "fork", None, 0),
    "stdlib Pipe+pickle5": ("stdlib-pipe", "fork", None, 0),
    "floor: shm name via SimpleQueue": ("floor", "fork", None, 0),
}


# -- the echo children (module level, so spawn can import them) -----------------------------------

def echo(inbox, outbox, strategy=None, library=None):
    """Send back whatever arrives until None; drop each reference before the next get."""
    if library == "mpviz" and strategy:
        import mpviz.multiprocessing as mp
        mp.set_sharing_strategy(strategy)
    elif library == "torch" and strategy:
        import torch.multiprocessing as tmp
        tmp.set_sharing_strategy(strategy)
    while True:
        item = inbox.get()
        if item is None:
            return
        outbox.put(item)
        del item


def echo_pipe(conn):
    import pickle
    while True:
        data = conn.recv_bytes()
        if not data:
            return
        obj = pickle.loads(data)
        conn.send_bytes(pickle.dumps(obj, protocol=5))
        del obj


def nothing(*args):
    """The empty function whose start-up is measured."""


# -- a driver -------------------------------------------------------------------------------------

class Driver:
    def __init__(self, name):
        self.name = name
        self.library, self.method, self.strategy, cache_bytes = CONTENDERS[name]
        if self.library == "mpviz":
            os.environ["MPVIZ_SHM_CACHE_BYTES"] = str(cache_bytes)
            import mpviz
            import mpviz.multiprocessing as mp
            mp.set_sharing_strategy(self.strategy)
            self.lib, self.mp = mpviz, mp
            ctx = mp.get_context(self.method)
        elif self.library == "torch":
            import torch
            import torch.multiprocessing as tmp
            tmp.set_sharing_strategy(self.strategy)
            self.lib, self.mp = torch, tmp
            ctx = tmp.get_context(self.method)
        else:
            import multiprocessing
            ctx = multiprocessing.get_context(self.method)
        self.ctx = ctx
        if self.library == "stdlib-pipe":
            self.conn, child_conn = ctx.Pipe()
            self.child = ctx.Process(target=echo_pipe, args=(child_conn,), daemon=True)
        else:
            simple = self.library == "floor"
            self.q1 = ctx.SimpleQueue() if simple else ctx.Queue()
            self.q2 = ctx.SimpleQueue() if simple else ctx.Queue()
            self.child = ctx.Process(target=echo, args=(self.q1, self.q2, self.strategy, self.library),
                                     daemon=True)
        self.child.start()
        self.shared = {}

    def make(self, nbytes):
        """A new tensor (or array) of `nbytes` bytes, its pages already touched."""
        n = max(nbytes // 4, 1)
        if self.library in ("mpviz", "torch"):
            return self.lib.ones(n)
        return np.ones(n, dtype=np.float32)

    def shared_item(self, nbytes):
        if nbytes not in self.shared:
            if self.library in ("mpviz", "torch"):
                self.shared[nbytes] = self.make(nbytes).share_memory_()
            elif self.library == "floor":
                from multiprocessing import shared_memory
                shm = shared_memory.SharedMemory(create=True, size=nbytes)
                self.shared[nbytes] = shm
            else:
                self.shared[nbytes] = self.make(nbytes)  # stdlib: every trip copies anyway
        return self.shared[nbytes]

    def round_trip(self, item):
        if self.library == "stdlib-pipe":
            import pickle
            t0 = time.perf_counter()
            self.conn.send_bytes(pickle.dumps(item, protocol=5))
            back = pickle.loads(self.conn.recv_bytes())
            elapsed = time.perf_counter() - t0
        else:
            payload = item.name if self.library == "floor" else item  # the floor sends a name
            t0 = time.perf_counter()
            self.q1.put(payload)
            back = self.q2.get()
            elapsed = time.perf_counter() - t0
        del back
        return elapsed

    def rt(self, kind, nbytes, n):
        if kind != "shared" and self.library == "floor":
            return {"skipped": "the floor has no fresh variant"}
        times = []
        for _ in range(n):
            if kind == "shared":
                times.append(self.round_trip(self.shared_item(nbytes)))
            else:
                item = self.make(nbytes)
                times.append(self.round_trip(item))
                del item
        out = {"times": times}
        if self.library == "mpviz":
            from mpviz.sharing import allocator
            out["cache"] = allocator.stats()
        return out

    def close(self):
        if self.library == "stdlib-pipe":
            self.conn.send_bytes(b"")
        else:
            self.q1.put(None)
        self.child.join(30)
        for item in self.shared.values():
            if self.library == "floor":
                item.close()
                item.unlink()
        self.shared.clear()


def startup(kind, n):
    """Time starting two processes that run an empty function, and joining them, `n` times."""
    times = []
    note = None
    for _ in range(n):
        if kind == "torch":
            import torch.multiprocessing as tmp
            t0 = time.perf_counter()
            tmp.spawn(nothing, nprocs=2)
        elif kind == "mpviz":
            import mpviz.multiprocessing as mp
            t0 = time.perf_counter()
            mp.spawn(nothing, nprocs=2)
            note = "mpviz.multiprocessing.spawn(nprocs=2)"
        else:
            import multiprocessing
            ctx = multiprocessing.get_context("spawn")
            t0 = time.perf_counter()
            ps = [ctx.Process(target=nothing, args=(i,)) for i in range(2)]
            for p in ps:
                p.start()
            for p in ps:
                p.join()
            note = "2 x stdlib Process start+join under spawn"
        times.append(time.perf_counter() - t0)
    return {"times": times, "note": note}


def serve(driver, answer):
    """The driver's side of the pipe: say ready, then one JSON reply per command line until
    'quit' or end of input. answer(words) makes one reply; an exception becomes {"error": ...}
    (report, don't die: the orchestrator notes it in the table). Used by bench_fresh too."""
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            reply = answer(words)
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    if driver is not None:
        driver.close()


def main(argv):
    name = argv[0]
    if name.startswith("startup:"):
        driver = None
    else:
        driver = Driver(name)

    def answer(words):
        if words[0] == "rt":
            return driver.rt(words[1], int(words[2]), int(words[3]))
        if words[0] == "startup":
            return startup(name.split(":", 1)[1], int(words[1]))
        return {"error": f"unknown command {words[0]!r}"}

    serve(driver, answer)


if __name__ == "__main__":
    # Run the module's own copy, not __main__'s, so spawned children find echo() by its real name.
    from bench.handoff import main as _main
    _main(sys.argv[1:])
