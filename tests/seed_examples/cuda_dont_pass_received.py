# Seed 004, best practice 3: "Don't pass received tensors". The "not going to work" lines are
# refused with an error that says to clone; the "process-local copy" lines work. Only imports differ.
import mpviz as torch
import mpviz.multiprocessing as mp


def middle(queue, queue_2, done):
    # not going to work
    x = queue.get()
    try:
        queue_2.put(x)
    except RuntimeError as e:
        print(f"refused: {e}")
    # you need to create a process-local copy
    x = queue.get()
    x_clone = x.clone()
    queue_2.put(x_clone)
    del x
    done.wait()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    queue, queue_2, done = mp.Queue(), mp.Queue(), mp.Event()
    p = mp.Process(target=middle, args=(queue, queue_2, done))
    p.start()
    tensor = torch.ones(5).cuda()
    queue.put(tensor)
    queue.put(tensor)
    y = queue_2.get()
    print(f"clone arrived: {y.cpu().tolist()}")
    del y
    done.set()
    p.join()
    torch.cuda.ipc_collect()
