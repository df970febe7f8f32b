"""Exercises of notebook 00 (overview): read the bytes off a real queue-sharing run."""
import statistics

from .base import Exercise, Verdict, as_number, fix_scenario, judged, measured, run

_NUMEL = 262144                 # float32 elements: 1 MiB


@measured
def _big_run():
    """queue-sharing with a 1 MiB tensor: its copies, and the messages that carried the tensor
    (those put by the process that created the tensor's segment)."""
    result = run("queue-sharing", numel=_NUMEL)
    copies = [e.args.get("nbytes") for e in result.trace.of_kind("copy")]
    creators = {s.created_by for s in result.trace.segments()}
    tensor_messages = [f.put.args.get("nbytes") for f in result.trace.flows()
                       if f.put.pid in creators]
    return result, copies, tensor_messages


@judged
def _judge_predict(answer):
    said = as_number(answer, "a number of bytes")
    result, copies, _ = _big_run()
    first = copies[0]
    return Verdict(abs(said - first) <= 0.05 * first, (
        f"You said {said:,.0f} bytes; the first put copied {first:,} bytes ({first / 2**20:g} "
        f"MiB): the whole tensor, {_NUMEL:,} float32 elements x 4 bytes, moved once into shared "
        f"memory. The run recorded {len(copies)} copy in all: the second put found the tensor "
        f"already shared."))


@judged
def _judge_picture(answer):
    said = as_number(answer, "a number of bytes")
    result, _, sizes = _big_run()
    typical = statistics.median(sizes)
    return Verdict(typical / 2 <= said <= typical * 2, (
        f"You read {said:,.0f} bytes; the messages that carried the tensor were "
        f"{', '.join(f'{n} B' for n in sizes)} (within a factor of 2 counts as right: labels "
        f"are rounded). A handle names the shared segment; its size does not depend on the "
        f"tensor's: the 1 MiB of data stayed in shared memory."))


EXERCISES = [
    Exercise(
        "00.predict-first-copy", "predict",
        f"queue-sharing with numel={_NUMEL} (a 1 MiB float32 tensor): how many bytes does the "
        f"first put copy?",
        "a number of bytes, e.g. 2**20 for 1 MiB", _judge_predict),
    fix_scenario(
        "00.fix-producer-exits",
        "producer-exits comes out ERROR: the consumer's second get fails. Read its verdict and "
        "change one parameter so that it comes out OK.",
        "producer-exits", at_most=1),
    Exercise(
        "00.picture-message-bytes", "picture",
        f"On the timeline of queue-sharing with numel={_NUMEL}, about how many bytes does each "
        f"green arrow (a message carrying the tensor) carry?",
        "a number of bytes", _judge_picture),
]
