"""Exercises of notebook 06 (CUDA lifetime), on the CUDA simulator (or a GPU)."""
from .base import Exercise, Verdict, as_bool, as_number_pair, fix_scenario, judged, measured, run


@measured
def _held():
    return {early: run("cuda-release-late", release_early=early)
            .details["producer_stats"]["held_for_consumers_bytes"] for early in (False, True)}


@judged
def _judge_predict(answer):
    late, early = as_number_pair(
        answer, "(bytes with release_early=False, bytes with release_early=True)",
        "a number of bytes")
    real = _held()
    return Verdict((late, early) == (real[False], real[True]), (
        f"You said ({late:g}, {early:g}); the producer's memory_stats() showed "
        f"{real[False]} bytes held for consumers with release_early=False and {real[True]} with "
        f"release_early=True. The tensor is 4096 float32 = 16384 bytes: while the consumer "
        f"holds it, the producer's block waits in limbo; once the consumer has dropped it, "
        f"nothing is held. (held_for_consumers_bytes is mpviz's key, not torch's.)"))


@measured
def _producer_ended_first():
    result = run("cuda-producer-exits")
    producer = next(p.pid for p in result.trace.processes() if p.name == "producer")
    exit_ns = min(e.ts_ns for e in result.trace.of_kind("process.exit") if e.pid == producer)
    read_ns = min(e.ts_ns for e in result.trace.of_kind("mark")
                  if "consumer reads" in str(e.args.get("name", "")))
    return exit_ns < read_ns, result


@judged
def _judge_picture(answer):
    said = as_bool(answer)
    ended, result = _producer_ended_first()
    return Verdict(said == ended, (
        f"You said {said}; the producer's lane had {'already ended' if ended else 'not ended'} "
        f"when the consumer read its tensor. "
        + (f"The producer exited still owing a block to the consumer (its warning is the mark "
           f"at the end of its lane); the consumer read afterwards, from freed memory, and got "
           f"{result.details['read'][2]} (the simulator poisons freed memory)." if ended else
           f"The lesson expects it to have ended; the verdict: {result.explanation}")))


EXERCISES = [
    Exercise(
        "06.predict-held", "predict",
        "cuda-release-late: how many bytes does the producer's memory_stats() show as "
        "held_for_consumers_bytes with release_early=False, and with release_early=True?",
        "a pair of numbers, (release_early=False, release_early=True)", _judge_predict),
    fix_scenario(
        "06.fix-repass",
        "cuda-repass: a relay process receives a CUDA tensor and tries to send it on, and is "
        "refused. Give the parameter that fixes it.",
        "cuda-repass"),
    Exercise(
        "06.picture-producer-gone", "picture",
        "In the cuda-producer-exits timeline, had the producer's lane already ended when the "
        "consumer read its tensor?",
        "True (it had ended) or False", _judge_picture),
]
