"""What activations cost one rank, and what activation checkpointing and gradient accumulation save: one optimizer
step of the steps' recipe, its memory tracked by torch's MemTracker and its time measured.

    python benchmarks/activations.py --out benchmarks/published/activations   # with nothing else running

One process, one rank's share of the steps' global batch (128 over 2 ranks: 64 images), AdamW as the steps make it.
Four ways to take the same step: as is; each transformer block checkpointed (torch's checkpoint_wrapper, non-reentrant:
a block keeps its input and recomputes the rest in backward); the 64 images as 4 micro-batches of 16, gradients
accumulated (the steps' --grad-accum-steps); and both. Each way's peak comes from a step after a first one, so that
AdamW's state exists (torch.distributed._tools.mem_tracker.MemTracker: every tensor by kind, at the step's peak); its
time is the median of --steps steps after one to warm up, without the tracker; its weights after the two tracked
steps are compared with the first way's. DDP's buckets and FSDP's shards change
the parameters' and gradients' rows, not the activations'. tables.py renders the tables from results.json.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

from benchmarks.record import describe_commit, describe_machine, made_by
from common.flags import make_parser
from common.model import TRANSFORMER_BLOCK, build_model
from common.training import make_optimizer

WAYS = {"as is": (False, 1), "checkpointed blocks": (True, 1), "4 micro-batches": (False, 4),
        "both": (True, 4)}  # name: (activation checkpointing, micro-batches)
KINDS = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients", "OPT": "optimizer state",
         "ACT": "activations", "TEMP": "temporaries", "OTH": "other"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/activations"))
    parser.add_argument("--model", default="small")
    parser.add_argument("--images", type=int, default=64, help="one rank's share of the global batch")
    parser.add_argument("--steps", type=int, default=5, help="steps timed, after one to warm up")
    args = parser.parse_args()
    machine, made = describe_machine(), made_by(describe_commit(("common", "benchmarks/activations.py"),
                                                                "common/ or this script"))
    ways, weights = zip(*(measure(name, *way, args) for name, way in WAYS.items()), strict=True)
    for way, own in zip(ways, weights, strict=True):  # the same step, computed another way: float rounding apart
        way["weights_max_difference_from_as_is"] = max((a - b).abs().max().item()
                                                       for a, b in zip(own, weights[0], strict=True))
    results = dict(machine=machine, **made, model=args.model, images=args.images, steps=args.steps, ways=list(ways))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out / 'results.json'}")


def build(checkpointed: bool, args):
    torch.manual_seed(0)
    model = build_model(args.model)
    if checkpointed:
        apply_activation_checkpointing(model, check_fn=lambda module: isinstance(module, TRANSFORMER_BLOCK))
    recipe = make_parser(__doc__, "activations").parse_args([])  # the steps' --lr and --weight-decay, as they default
    optimizer = make_optimizer(model, recipe, torch.device("cpu"))
    images, labels = torch.randn(args.images, 3, 32, 32), torch.randint(0, 10, (args.images,))
    return model, optimizer, images, labels


def step(model, optimizer, images, labels, micro_batches: int, tracker=None) -> None:
    for chunk, targets in zip(images.chunk(micro_batches), labels.chunk(micro_batches), strict=True):
        if tracker:
            tracker.reset_mod_stats()  # MemTracker follows one call per module: the micro-batches call each again
        loss = torch.nn.functional.cross_entropy(model(chunk), targets) / micro_batches
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(name: str, checkpointed: bool, micro_batches: int, args) -> tuple:
    """The way's measurements, and its weights after the two tracked steps."""
    model, optimizer, images, labels = build(checkpointed, args)
    tracker = MemTracker()
    tracker.track_external(model, optimizer, images, labels)
    with tracker:
        for _ in range(2):  # the second step's peak: AdamW's state exists from the first
            step(model, optimizer, images, labels, micro_batches, tracker)
    weights = [p.detach().clone() for p in model.parameters()]
    at_peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]  # kinds (str enums) and "Total"
    peak_total = at_peak.pop("Total")
    peak = {kind.name: nbytes for kind, nbytes in at_peak.items()}
    seconds = []
    step(model, optimizer, images, labels, micro_batches)  # warm-up
    for _ in range(args.steps):
        start = time.perf_counter()
        step(model, optimizer, images, labels, micro_batches)
        seconds.append(time.perf_counter() - start)
    way = dict(way=name, activation_checkpointing=checkpointed, micro_batches=micro_batches,
               peak_bytes=peak_total, at_peak_bytes={KINDS[k]: v for k, v in peak.items()},
               step_s=round(statistics.median(seconds), 3))
    print(json.dumps(way), flush=True)
    return way, weights


if __name__ == "__main__":
    main()
