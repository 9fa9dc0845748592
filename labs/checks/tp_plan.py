"""Lab 07's checks. First the lab's parallelize alone, on a model in a 2-rank group that sends nothing (torch's fake
process group, one process): how it split each block's Linear layers. Then main() in 2 processes, against the recipe in
1 process on whole batches, unsplit (labs.reference), both in float64: every optimizer step's gradients (each
parameter whole, q, k and v packed as the reference's attention holds them) and loss, and the all-reduces each rank
issued in forward and backward."""
import collections

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.utils._python_dispatch import TorchDispatchMode

from common.model import TRANSFORMER_BLOCK, build_model, pack_attention, split_attention
from labs import reference
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome
from labs.patching import watch_training
from labs.ranks import RunFailed, run_ranks

SPLIT = ("each rank holds half of every block's attention and MLP matrices: q, k, v and mlp.0 split by their outputs "
         "(column-wise), out_proj and mlp.3 by their inputs (row-wise)")
SAME_TRAINING = "2 ranks train what 1 unsplit process trains (every step's gradients and loss)"
ALL_REDUCES = ("per step and block, an all-reduce in forward for each row-wise layer's output (2), and in backward one "
               "for each pair's input gradient (2; 4 if each column-wise layer reduces its own): no other collective")
CHECKS = [SPLIT, SAME_TRAINING, ALL_REDUCES]
# The split each Linear of a block needs (the dimension of its weight that is split: 0, its outputs; 1, its inputs)
SPLITS = {"self_attention.q": 0, "self_attention.k": 0, "self_attention.v": 0, "self_attention.out_proj": 1,
          "mlp.0": 0, "mlp.3": 1}
COLUMN_WISE = "the first layer of each pair is column-wise: each rank computes its outputs (its heads, its MLP units)"
ROW_WISE = ("the second is row-wise: it takes the inputs that match the rank's outputs before it, and an all-reduce "
            "sums the ranks' partial outputs into the block's whole output")
LAYOUTS = ("each layer gets what the one before it hands on: a column-wise layer hands on this rank's share of its "
           "outputs, which the row-wise layer after it takes as its inputs; a row-wise layer hands on the whole output "
           "(Replicate, its default), which the residual adds to the block's whole input")
HEADS = ("this attention infers its heads from the width it is handed (view(batch, length, -1, head_dim)): q, k and v "
         "must hand on this rank's share as a plain tensor (use_local_output=True, ColwiseParallel's default), not a "
         "DTensor of the whole width")
EACH_BLOCK = "parallelize_module applies the plan to the one module it is given: each block needs it"


def run(lab_file) -> list:
    try:
        [splits] = run_ranks(f"{__name__}:planned", lab_file, 1)[1]
    except RunFailed as error:
        return [Outcome(SPLIT, f"parallelize failed: {error}", "parallelize_module(block, mesh, plan) takes each "
                                                                 "Linear's name inside the block"),
                *(Outcome(check, "not run: parallelize fails (above)", "") for check in CHECKS[1:])]
    split = split_outcome(splits)
    if not any(dim is not None for block in splits for dim in block.values()):
        return [split, Outcome(SAME_TRAINING, "nothing to compare: no layer of a block is split, each rank computes "
                                              "the whole model", ""),
                all_reduces(dict(losses=[], collectives={}))]
    try:
        alone, pair = run_ranks(f"{__name__}:watched_main", lab_file, 2, lambda: reference.recipe(1))
    except RunFailed as error:
        hint = split.hint if not split.passed else HEADS if "view" in str(error) else LAYOUTS
        return [split, Outcome(SAME_TRAINING, f"the run did not finish: {error}", hint),
                Outcome(ALL_REDUCES, "the run did not finish (above)", "")]
    return [split, same_training(alone, pair), all_reduces(pair[0])]


def planned(lab_file) -> list[dict]:
    """How the lab's parallelize split each block's Linear layers over 2 ranks: per block, {name: split dimension, or
    None for whole}."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh

    lab = load_lab(lab_file)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        torch.manual_seed(0)
        model = split_attention(build_model(lab_args().model))
        lab.parallelize(model, init_device_mesh("cpu", (2,)))
        return [{name: split_of(block.get_submodule(name).weight) for name in SPLITS}
                for block in model.modules() if isinstance(block, TRANSFORMER_BLOCK)]
    finally:
        dist.destroy_process_group()


def split_of(weight) -> int | None:
    if not isinstance(weight, DTensor):
        return None
    [placement] = weight.placements
    return placement.dim if isinstance(placement, Shard) else None


def split_outcome(blocks: list[dict]) -> Outcome:
    """Every block's split, the first block that differs from what it needs told."""
    whole = [index for index, splits in enumerate(blocks) if all(dim is None for dim in splits.values())]
    if whole and len(whole) < len(blocks):
        split = next(index for index in range(len(blocks)) if index not in whole)
        return Outcome(SPLIT, f"block {whole[0]} of {len(blocks)} is whole on every rank, block {split} is split",
                       EACH_BLOCK)
    for index, splits in enumerate(blocks):
        for name, want in SPLITS.items():
            got, layer = splits[name], name if index == 0 else f"block {index}'s {name}"
            if got == want:
                continue
            if got is None:
                return Outcome(SPLIT, f"{layer}'s weight is whole on every rank",
                               "parallelize_module splits the layers the plan names, in each block it is given; a "
                               "layer left out stays whole on every rank and computes everything twice")
            how = {0: "its outputs (column-wise)", 1: "its inputs (row-wise)"}
            return Outcome(SPLIT, f"{layer} is split by {how[got]}, not by {how[want]}",
                           COLUMN_WISE if want == 0 else ROW_WISE)
    return Outcome(SPLIT, None, "")


class CountAllReduces(TorchDispatchMode):
    """The collectives DTensor issues (functional collectives), by kind (counts) and by pass and kind (passes:
    forward, backward), and the bytes handed to each kind, while on (torch's CommDebugMode counts them too, but its
    module hooks fail on the conv stem's in-place ReLU)."""

    def __init__(self):
        super().__init__()
        self.counts, self.passes, self.bytes = collections.Counter(), collections.Counter(), collections.Counter()
        self.on = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = func.__name__.split(".")[0]
        if self.on and func.namespace == "_c10d_functional" and kind not in ("wait_tensor", "_wrap_tensor_autograd"):
            self.counts[kind] += 1
            self.passes["backward" if torch._C._current_graph_task_id() >= 0 else "forward", kind] += 1
            self.bytes[kind] += args[0].nbytes
        return func(*args, **(kwargs or {}))


def watched_main(lab_file) -> dict:
    """The lab's main() with its models built in float64, every optimizer step's gradients (whole: each split one
    gathered from the ranks, q, k and v packed as build_model's attention holds them) and the collectives counted,
    all but the check's own gathers."""
    counter = CountAllReduces()

    def whole_gradients(model) -> dict:
        counter.on = False
        whole = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                 for name, p in model.named_parameters() if p.grad is not None}
        counter.on = True
        return pack_attention(whole)

    watched = watch_training(float64=True, gradients_of=whole_gradients)
    lab = load_lab(lab_file)
    with counter:
        losses = lab.main(lab_args())
    return dict(losses=losses, gradients=watched["gradients"], sharded=watched["sharded"],  # none: all whole
                collectives=dict(counter.passes))


def same_training(alone: dict, pair: list[dict]) -> Outcome:
    hint = ("a row-wise layer's output on each rank is a partial sum: the ranks' shares added by an all-reduce (its "
            "output whole, Replicate, by default) make the layer's output, which the residual adds to the input")
    match reference.first_difference(alone, pair, reference.TOLERANCE):
        case "steps", steps, _:
            return Outcome(SAME_TRAINING, f"the ranks took {steps} optimizer steps; 1 process takes "
                                          f"{len(alone['steps'])}", hint)
        case "ranks differ", step, _:
            return Outcome(SAME_TRAINING, f"step {step}: the 2 ranks' gradients differ, as if each trained a model "
                                          "of its own", hint)
        case ("factor" | "differ") as kind, step, value:
            how = f"{value:.2f} times" if kind == "factor" else f"{value:.1%} away from"
            return Outcome(SAME_TRAINING, f"step {step}: the gradients are {how} 1 process's", hint)
    if differs := reference.first_loss_difference(alone, pair[0]["losses"], reference.TOLERANCE):
        return Outcome(SAME_TRAINING, "step {}: 2 ranks' train loss {:.5f}, 1 process's {:.5f}".format(*differs), hint)
    return Outcome(SAME_TRAINING, None, "")


def all_reduces(watched: dict) -> Outcome:
    """What the plan must do per step: each pair's sum in forward, and its input's gradient summed in backward (once
    per pair, or once per column-wise layer: torch's own plans do either)."""
    blocks = sum(isinstance(m, TRANSFORMER_BLOCK) for m in build_model(lab_args().model).modules())
    steps = max(1, len(watched["losses"]))
    per_step = {(phase, kind): calls / steps for (phase, kind), calls in watched["collectives"].items()}
    forward, backward = (per_step.get((phase, "all_reduce"), 0) for phase in ("forward", "backward"))
    others = {key: calls for key, calls in per_step.items() if key[1] != "all_reduce"}
    if not others and forward == 2 * blocks and 2 * blocks <= backward <= 4 * blocks:
        return Outcome(ALL_REDUCES, None, "")
    shown = ", ".join(f"{calls:g} {kind.replace('_', '-')}s in {phase}" for (phase, kind), calls
                      in sorted(per_step.items(), key=lambda item: (item[0][0] != "forward", item[0][1]))) or "none"
    return Outcome(ALL_REDUCES, f"per step: {shown}; {blocks} blocks' 2 column-to-row pairs make {2 * blocks} "
                                f"all-reduces in forward and {2 * blocks} to {4 * blocks} in backward",
                   "a row-wise layer all-reduces its output in forward, a column-wise layer its input's gradient in "
                   "backward; a layer that hands on a share the next one does not expect makes DTensor gather or "
                   "redistribute it")
