"""Lab 04's checks: main() in 2 processes, under a profiler, against the recipe in 1 process, unsharded
(labs.reference), both in float64. Each rank records what it holds once shard_model returns, the gradients of every
optimizer step (its shards of them: labs.patching.watch_training), and the collectives it issued."""
import collections

import torch
from torch.distributed.tensor import DTensor

from common.model import TRANSFORMER_BLOCK, build_model
from labs import reference
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.patching import watch_training
from labs.ranks import RunFailed, run_ranks

HALF_EACH = "the 2 ranks hold the model once between them, about half each (a shard of every parameter)"
SAME_TRAINING = "2 sharded ranks train what 1 unsharded process trains (every step's gradients and loss)"
ALL_GATHERS = ("per step, one all-gather per block and one for the root in forward, one per block again in backward: "
               "the blocks free their gathered weights after forward, the root keeps its")
CHECKS = [HALF_EACH, SAME_TRAINING, ALL_GATHERS]


def run(lab_file) -> list:
    try:
        alone, pair = run_ranks(f"{__name__}:watched_main", lab_file, 2, lambda: reference.recipe(1))
    except RunFailed as error:
        return crashed(CHECKS, str(error))
    return [half_each(pair), same_training(alone, pair), all_gathers(pair[0])]


def watched_main(lab_file) -> dict:
    return watch(lab_file, lab_args())


def watch(lab_file, args) -> dict:
    """The lab's main() under the profiler, with what this rank holds once shard_model returns, and the gradients
    of every optimizer step."""
    watched = watch_training(float64=True)
    lab = load_lab(lab_file)
    held = {}

    def watched_shard_model(model, mesh):
        shard_model(model, mesh)
        held.update(local=sum(local(p).numel() for p in model.parameters()),
                    whole=sum(p.numel() for p in model.parameters() if not isinstance(p, DTensor)))

    shard_model, lab.shard_model = lab.shard_model, watched_shard_model
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        losses = lab.main(args)
    collectives = collections.Counter(e.name for e in profile.events() if e.name.startswith("c10d::"))
    return dict(losses=losses, held=held, collectives=dict(collectives), gradients=watched["gradients"],
                sharded=watched["sharded"])


def local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def half_each(pair: list[dict]):
    total = sum(p.numel() for p in build_model(lab_args().model).parameters())
    held = [watched["held"] for watched in pair]
    failure = None
    if held[0]["whole"] or sum(h["local"] for h in held) != total:
        failure = (f"rank 0 holds {held[0]['local']:,} of the {total:,} parameter values ({held[0]['whole']:,} of "
                   f"them whole, not sharded), rank 1 {held[1]['local']:,}")
    return Outcome(HALF_EACH, failure, "fully_shard splits over the mesh every parameter of the module it is given "
                                       "that no sharded submodule already holds; a module never given to it stays "
                                       "whole on every rank")


def same_training(alone: dict, pair: list[dict]):
    hint = ("a sharded parameter's gradient is reduce-scattered over the ranks in backward, averaged; a whole one "
            "only learns from its own rank's images")
    match reference.first_difference(alone, pair, reference.TOLERANCE):
        case "ranks differ", step, _:
            return Outcome(SAME_TRAINING, f"step {step}: the gradients of the parameters left whole differ between "
                                          "the ranks", hint)
        case ("factor" | "differ") as kind, step, value:
            how = f"{value:.2f} times" if kind == "factor" else f"{value:.1%} away from"
            return Outcome(SAME_TRAINING, f"step {step}: the ranks' gradients, put together, are {how} 1 "
                                          "process's", hint)
        case "steps", steps, _:
            return Outcome(SAME_TRAINING, f"the ranks took {steps} optimizer steps; 1 process takes "
                                          f"{len(alone['steps'])}", hint)
    if differs := reference.first_loss_difference(alone, pair[0]["losses"], reference.TOLERANCE):
        return Outcome(SAME_TRAINING, "step {}: 2 ranks' train loss {:.5f}, 1 process's {:.5f}".format(*differs), hint)
    return Outcome(SAME_TRAINING, None, "")


def all_gathers(watched: dict):
    blocks = sum(isinstance(m, TRANSFORMER_BLOCK) for m in build_model(lab_args().model).modules())
    expected = 2 * blocks + 1
    per_step = watched["collectives"].get("c10d::_allgather_base_", 0) / len(watched["losses"])
    failure, hint = None, ("each fully_shard call makes a unit, gathered in one all-gather just before it runs; "
                           "reshard_after_forward decides whether it frees its gathered weights after forward")
    if per_step == blocks + 1:
        failure = f"{per_step:g} all-gathers per step: the blocks kept their gathered weights from forward to backward"
        hint = ("a block that keeps its gathered weights after forward saves an all-gather in backward, but then "
                "every block is whole at once, as unsharded: free them after forward, as by default")
    elif per_step == 2 * blocks + 2:
        failure = f"{per_step:g} all-gathers per step: the root freed its weights after forward"
        hint = ("backward starts at the root (its head and final norm): freed after forward, its weights are "
                "gathered again at once; the root keeps them, as by default")
    elif per_step != expected:
        failure = f"{per_step:g} all-gathers per step; {blocks} blocks and the root make {expected}"
    return Outcome(ALL_GATHERS, failure, hint)
