"""Exercises of notebook 02 (sharing tensors): a real child reports what arrived."""
from .. import multiprocessing as mp
from ..tensor import Tensor
from ..examples import notebook_workers as nw
from .base import (BadAnswer, Exercise, Verdict, as_number, as_number_pair, judged, measured, run,
                   shown)


@measured
def _rows_1_and_2():
    """Send x[1:3] of a 4x4 zeros tensor to a spawned child that fills it with 5."""
    import mpviz as torch
    ctx = mp.get_context("spawn")
    x = torch.zeros(4, 4)
    q, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=nw.receive_and_fill, args=(q, results, 5.0))
    child.start()
    q.put(x[1:3])
    arrived, _after = results.get()
    child.join()
    q.close()
    results.close()
    return arrived, [int(row[0]) for row in x.tolist()]


@judged
def _judge_predict(answer):
    offset, nbytes = as_number_pair(answer, "(storage_offset, storage_bytes), e.g. (0, 16)",
                                    "a number")
    arrived, rows = _rows_1_and_2()
    real = (arrived["storage_offset"], arrived["storage_bytes"])
    return Verdict((offset, nbytes) == real, (
        f"You said ({offset:g}, {nbytes:g}); the child reported storage_offset="
        f"{real[0]} and storage_bytes={real[1]}. x[1:3] starts at row 1, element 4, and is "
        f"still a view of x's whole storage (16 float32 = 64 bytes): a view travels with all of "
        f"its storage. After the child's fill_(5), the first column of the parent's rows reads "
        f"{rows}: rows 1 and 2 became 5."))


@judged
def _judge_fix(answer):
    if not isinstance(answer, Tensor):
        raise BadAnswer(f"the answer is the tensor to put instead of y, not {shown(answer)}")
    q = mp.SimpleQueue()             # pickles inside put: a refusal is raised right here
    try:
        q.put(answer)
    except RuntimeError as exc:
        return Verdict(False, f"put still refused it: {exc}")
    got = q.get()
    q.close()
    values = got.tolist()
    if values != [2.0, 2.0, 2.0]:
        return Verdict(False, f"It travelled, but it holds {values}, not y's values [2.0, 2.0, "
                              f"2.0].")
    return Verdict(True, f"put accepted it and {values} arrived (requires_grad="
                         f"{got.requires_grad}). y.detach() gives a tensor with y's data and no "
                         f"graph: the data can cross a process boundary, the graph cannot.")


@measured
def _segments():
    result = run("queue-sharing")
    return result, result.trace.segments()


@judged
def _judge_picture(answer):
    said = as_number(answer, "a number of segments")
    result, segments = _segments()
    names = {p.pid: p.name for p in result.trace.processes()}
    who = "; ".join(f"created by {names.get(s.created_by, s.created_by)}, mapped by "
                    f"{', '.join(names.get(pid, str(pid)) for pid in s.attached_by) or 'nobody'}"
                    for s in segments)
    return Verdict(said == len(segments), (
        f"You counted {said:g}; the run had {len(segments)} shared segment(s): {who}. The "
        f"tensor was put twice, but only the first put moved it into shared memory; the "
        f"second found it shared and sent a handle to the same segment."))


EXERCISES = [
    Exercise(
        "02.predict-view", "predict",
        "x = torch.zeros(4, 4); a child gets x[1:3] (rows 1 and 2) through nw.receive_and_fill. "
        "Which storage_offset and storage_bytes does it report?",
        "a pair of numbers, (storage_offset, storage_bytes)", _judge_predict),
    Exercise(
        "02.fix-nonleaf", "fix",
        "w = torch.ones(3, requires_grad=True); y = w * 2; q.put(y) is refused. Give the tensor "
        "to put instead, so that y's values [2., 2., 2.] arrive.",
        "a tensor made from y", _judge_fix),
    Exercise(
        "02.picture-segments", "picture",
        "In the memory map of queue-sharing, how many shared-memory segments are there?",
        "a number of segments", _judge_picture),
]
