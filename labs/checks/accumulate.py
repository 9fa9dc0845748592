"""Lab 04-accumulate's checks: main() in 2 processes under a profiler, 2 micro-batches per optimizer step, against the
recipe in 1 process on whole batches, unsharded and un-accumulated (labs.reference), both in float64. The profiler
counts the reduce-scatters each rank issued; every optimizer step's gradients are recorded
(labs.checks.fully_shard.watch)."""
from common.model import TRANSFORMER_BLOCK, build_model
from labs import reference
from labs.checks.fully_shard import watch
from labs.harness import lab_args
from labs.outcome import Outcome, crashed
from labs.ranks import RunFailed, run_ranks

ACCUMULATE = ["--grad-accum-steps", "2"]
SAME_STEPS = ("one optimizer step per 2 micro-batches, with 1 process's gradients of the whole batch: summed over "
              "the micro-batches, each its share of the mean")
ONE_REDUCE_SCATTER = "one reduce-scatter per unit per optimizer step, not per micro-batch"
SAME_LOSS = "each optimizer step's reported loss is 1 process's on the whole batch"
CHECKS = [SAME_STEPS, ONE_REDUCE_SCATTER, SAME_LOSS]


def run(lab_file) -> list:
    try:
        alone, pair = run_ranks(f"{__name__}:watched_main", lab_file, 2, lambda: reference.recipe(1))
    except RunFailed as error:
        return crashed(CHECKS, str(error))
    return [same_steps(alone, pair), one_reduce_scatter(alone, pair[0]), same_loss(alone, pair[0])]


def watched_main(lab_file) -> dict:
    return watch(lab_file, lab_args(*ACCUMULATE))


def same_steps(alone: dict, pair: list[dict]):
    match reference.first_difference(alone, pair, reference.TOLERANCE):
        case "steps", steps, _:
            return Outcome(SAME_STEPS, f"{steps} optimizer steps for {len(alone['steps'])} batches of "
                                       f"{ACCUMULATE[1]} micro-batches",
                           "the optimizer steps once per batch, after its last micro-batch's backward")
        case "factor", step, ratio:
            return Outcome(SAME_STEPS, f"step {step}: the gradients are {ratio:.2f} times 1 process's",
                           "backward adds up the micro-batches' gradients: each micro-batch's loss must be its share "
                           "of the whole batch's mean, divided by the number of micro-batches")
        case _, step, difference:
            return Outcome(SAME_STEPS, f"step {step}: the gradients are {difference:.1%} away from 1 process's",
                           "a step's gradients must add up every micro-batch's (zeroed only before the first), and "
                           "be reduce-scattered once they are all there: in the last micro-batch's backward")
    return Outcome(SAME_STEPS, None, "")


def one_reduce_scatter(alone: dict, watched: dict):
    units = 1 + sum(isinstance(m, TRANSFORMER_BLOCK) for m in build_model(lab_args().model).modules())
    per_step = watched["collectives"].get("c10d::_reduce_scatter_base_", 0) / len(alone["steps"])
    failure = None
    if per_step != units:
        failure = (f"{per_step:g} reduce-scatters per optimizer step of {ACCUMULATE[1]} micro-batches; the model's "
                   f"{units} units need {units}")
    return Outcome(ONE_REDUCE_SCATTER, failure, "every backward of a sharded model reduce-scatters its gradients "
                                                "unless told the sync can wait: only the last micro-batch's needs it")


def same_loss(alone: dict, watched: dict):
    if len(watched["losses"]) != len(alone["steps"]):
        return Outcome(SAME_LOSS, f"{len(watched['losses'])} losses reported for {len(alone['steps'])} optimizer "
                                  "steps", "one loss per optimizer step")
    if differs := reference.first_loss_difference(alone, watched["losses"], reference.TOLERANCE):
        return Outcome(SAME_LOSS, "step {}: 2 ranks reported train loss {:.5f}, 1 process {:.5f}".format(*differs),
                       "a step's loss is the sum of its micro-batches' shares, averaged over the ranks")
    return Outcome(SAME_LOSS, None, "")
