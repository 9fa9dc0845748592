"""Lab 04's checks: main() in 2 processes, under a profiler, against main() in 1 process with shard_model skipped
(plain training). Each rank records what it holds once shard_model returns, and the collectives it issued."""
import collections

import torch
from torch.distributed.tensor import DTensor

from common import TRANSFORMER_BLOCK, build_model
from labs.harness import Outcome, RunFailed, crashed, lab_args, load_lab, run_groups

HALF_EACH = "the 2 ranks hold the model once between them, about half each (a shard of every parameter)"
SAME_LOSS = "2 sharded ranks train what 1 unsharded process trains (the loss of every step)"
ALL_GATHERS = "per step, one all-gather per block and one for the root in forward, one per block again in backward"
# 2 ranks of 16 images reduce their gradients in another order than 1 process of 32: the losses end this close.
LOSS_TOLERANCE = 1e-4


def run(lab_file) -> list:
    try:
        [alone], pair = run_groups(lab_file, [(f"{__name__}:unsharded_main", 1), (f"{__name__}:watched_main", 2)])
    except RunFailed as error:
        return crashed([HALF_EACH, SAME_LOSS, ALL_GATHERS], str(error))
    return [half_each(pair), same_loss(alone, pair[0]), all_gathers(pair[0])]


def unsharded_main(lab_file) -> dict:
    lab = load_lab(lab_file)
    lab.shard_model = lambda model, mesh: None
    return dict(losses=lab.main(lab_args()))


def watched_main(lab_file) -> dict:
    return watch(lab_file, lab_args())


def watch(lab_file, args) -> dict:
    """The lab's main() under the profiler, with what this rank holds once shard_model returns."""
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
    return dict(losses=losses, held=held, collectives=dict(collectives))


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


def same_loss(alone: dict, watched: dict):
    for step, (one, two) in enumerate(zip(alone["losses"], watched["losses"], strict=True)):
        if abs(one - two) > LOSS_TOLERANCE:
            return Outcome(SAME_LOSS, f"step {step + 1}: 2 ranks' train loss {two:.5f}, 1 process's {one:.5f}",
                           "a sharded parameter's gradient is reduce-scattered over the ranks in backward; a whole "
                           "one only learns from its own rank's images")
    return Outcome(SAME_LOSS, None, "")


def all_gathers(watched: dict):
    blocks = sum(isinstance(m, TRANSFORMER_BLOCK) for m in build_model(lab_args().model).modules())
    expected = 2 * blocks + 1
    per_step = watched["collectives"].get("c10d::_allgather_base_", 0) / len(watched["losses"])
    failure = None
    if per_step != expected:
        failure = f"{per_step:g} all-gathers per step; {blocks} blocks and the root make {expected}"
    return Outcome(ALL_GATHERS, failure, "each fully_shard call makes a unit, gathered in one all-gather just before "
                                         "it runs and freed after, unless told to keep it for backward")
