"""Lab 04-accumulate's check: main() in 2 processes under a profiler, 2 micro-batches per optimizer step, against
main() in 1 process. The profiler counts the reduce-scatters each rank issued (labs.checks.fully_shard.watch)."""
from common import TRANSFORMER_BLOCK, build_model
from labs.checks.fully_shard import LOSS_TOLERANCE, watch
from labs.harness import Outcome, RunFailed, crashed, lab_args, run_groups

ACCUMULATE = ["--grad-accum-steps", "2"]
ONE_REDUCE_SCATTER = ("one reduce-scatter per unit per optimizer step, not per micro-batch, training what 1 process "
                      "trains")


def run(lab_file) -> list:
    try:
        [alone], pair = run_groups(lab_file, [(f"{__name__}:watched_main", 1), (f"{__name__}:watched_main", 2)])
    except RunFailed as error:
        return crashed([ONE_REDUCE_SCATTER], str(error))
    return [one_reduce_scatter(alone, pair[0])]


def watched_main(lab_file) -> dict:
    return watch(lab_file, lab_args(*ACCUMULATE))


def one_reduce_scatter(alone: dict, watched: dict):
    units = 1 + sum(isinstance(m, TRANSFORMER_BLOCK) for m in build_model(lab_args().model).modules())
    per_step = watched["collectives"].get("c10d::_reduce_scatter_base_", 0) / len(watched["losses"])
    losses = enumerate(zip(alone["losses"], watched["losses"], strict=True))
    differing = [(step, one, two) for step, (one, two) in losses if abs(one - two) > LOSS_TOLERANCE]
    if per_step != units:
        failure = (f"{per_step:g} reduce-scatters per optimizer step of {ACCUMULATE[1]} micro-batches; the model's "
                   f"{units} units need {units}")
        hint = ("every backward of a sharded model reduce-scatters its gradients unless told the sync can wait: "
                "only the last micro-batch's sum needs it")
    elif differing:
        step, one, two = differing[0]
        failure = f"step {step + 1}: 2 ranks' train loss {two:.5f}, 1 process's {one:.5f}"
        hint = "the last micro-batch's reduce-scatter must carry the sum of every micro-batch's gradients"
    else:
        failure, hint = None, ""
    return Outcome(ONE_REDUCE_SCATTER, failure, hint)
