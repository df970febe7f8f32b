"""Exercises of notebook 11 (more pitfalls): each one runs the pitfall's scenario."""
from .base import Exercise, Verdict, as_number, fix_scenario, judged, measured, predict_outcome, run


def _fits_without_more_memory(result):
    return None if not result.details.get("errors") else "a worker still found /dev/shm full"


@measured
def _small_shm():
    return run("small-shm")


@judged
def _judge_picture(answer):
    count = as_number(answer, "a number of copies")
    result = _small_shm()
    copies = result.trace.of_kind("copy")
    sizes = " or ".join(str(mb) for mb in sorted({e.args.get("nbytes", 0) >> 20
                                                  for e in copies}))
    where = ("a real tmpfs" if result.details["where"] == "tmpfs" else "mpviz's cap")
    prm = result.params
    return Verdict(count == len(copies), (
        f"You counted {count:g}; the run recorded {len(copies)} copies of {sizes} MiB into "
        f"shared memory. {prm['workers']} workers x {prm['prefetch']} batches would be "
        f"{prm['workers'] * prm['prefetch']} batches of {prm['batch_mb']} MiB = "
        f"{prm['workers'] * prm['prefetch'] * prm['batch_mb']} MiB, but each segment also needs "
        f"a small header, so only {len(copies)} fitted in {prm['shm_mb']} MiB ("
        f"against {where}); the next worker found /dev/shm full and sent its error "
        f"instead."))


EXERCISES = [
    predict_outcome(
        "11.predict-autograd-forkserver",
        "autograd-fork with start_method='forkserver' (the parent's weights on the GPU, the "
        "parent ran backward() first): will the worker's backward() be 'ok' or 'error'?",
        "autograd-fork", start_method="forkserver"),
    fix_scenario(
        "11.fix-small-shm",
        "small-shm fails in a 64 MiB /dev/shm. Keep shm_mb=64 and the 8 MiB batches; find a "
        "setting of workers or prefetch that fits.",
        "small-shm", keep={"shm_mb": 64, "batch_mb": 8}, extra=_fits_without_more_memory),
    predict_outcome(
        "11.predict-forkserver-global",
        "forkserver-default: the script whose worker reads the global CONFIG that main() "
        "fills in, run with the explicit fork context: 'ok' or 'error'?",
        "forkserver-default", breaks_on="global-state", fix="explicit-context"),
    Exercise(
        "11.picture-small-shm", "picture",
        "In the small-shm timeline (4 workers, prefetch 2, 8 MiB batches, 64 MiB), how many "
        "batches did the workers copy into shared memory? Read the labels of the red boxes on "
        "the workers' lanes: boxes close together may overlap, and one label names them all "
        "('copy 8 MiB' is one, '2 copies, 16 MiB' is two).",
        "a number of copies", _judge_picture),
]
