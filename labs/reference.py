"""What the distributed labs are checked against: the recipe in one process, on whole batches, unsharded and
un-accumulated, written here rather than by the attendee. Its images come in the order DistributedSampler splits
over the ranks (a permutation seeded with seed + epoch): N ranks of batch/N images each must train what it trains."""
import torch

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer
from labs.cache import load_reference, save_reference
from labs.harness import lab_args
from labs.patching import in_float64

# How far the ranks' run may be from the reference's (a relative difference of gradients or of the weights' updates;
# an absolute one of losses near 2), both run in float64 (labs.patching.in_float64). A batch split over 2 ranks sums
# in another order than 1 process's, and AdamW's division by sqrt(v) + eps magnifies the difference step after
# step: in float32 it reached 4e-6 to 8e-6 by step 8 on an Intel Xeon (AVX-512, ATen's kernels at avx512, avx2 or
# default, MKL's and oneDNN's held to AVX2 or SSE), and passed the old bound of 1e-4 on an AMD Zen 3. In float64
# every rounding error is 2**29 times smaller and the same steps magnify it alike: 4e-15 to 2e-14 measured there,
# so a processor would need float32 differences of 100% (gradients unrelated) to come near 1e-6. A wrong answer
# is no rounding: it differs at every precision, and the float32 check told each one apart at 1e-4.
TOLERANCE = 1e-6


def recipe(epochs: int) -> dict:
    """train() at the lab's settings, on one thread as a rank runs it: run once for the code as it is, then read
    back, so that every try of a lab is compared with the same run."""
    name = f"recipe-{epochs}-epochs"
    if (kept := load_reference(name)) is not None:
        return kept
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return save_reference(name, train(lab_args(), epochs))
    finally:
        torch.set_num_threads(threads)


def train(args, epochs: int) -> dict:
    """epochs of args.steps_per_epoch steps of args.batch_size images: each step's images, loss and gradients,
    each epoch's mean loss and accuracy on the whole evaluation set, and the initial and final weights."""
    data = load_data(args.data, args.data_dir, args.eval_images)
    torch.manual_seed(args.seed)
    model = in_float64(build_model(args.model))
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = make_optimizer(model, args, torch.device("cpu"))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    steps, history = [], []
    for epoch in range(epochs):
        order = torch.randperm(len(data.train_labels), generator=torch.Generator().manual_seed(args.seed + epoch))
        for step in range(args.steps_per_epoch):
            ids = order[step * args.batch_size:(step + 1) * args.batch_size]
            optimizer.zero_grad(set_to_none=True)
            images = augment_batch(data.train_images[ids], ids, epoch, args.seed)
            loss = criterion(model(images), data.train_labels[ids])
            loss.backward()
            steps.append(dict(epoch=epoch, ids=ids.tolist(), loss=loss.item(), gradients=gradients(model)))
            optimizer.step()
        correct, counted = evaluate(model, data.test_images, data.test_labels, torch.device("cpu")).tolist()
        epoch_losses = [step["loss"] for step in steps[-args.steps_per_epoch:]]
        history.append(dict(epoch=epoch + 1, train_loss=sum(epoch_losses) / len(epoch_losses),
                            test_accuracy=correct / counted))
    return dict(steps=steps, history=history, initial=initial, weights=model.state_dict())


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def relative_difference(tensors: dict, reference: dict) -> float:
    """|a - b| / |b| over every tensor of reference at once (a missing one counts as zeros)."""
    difference = sum(((zeros_if_none(tensors.get(k), v) - v).double() ** 2).sum() for k, v in reference.items())
    return float((difference / sum((v.double() ** 2).sum() for v in reference.values())).sqrt())


def norm_ratio(tensors: dict, reference: dict) -> float:
    """|a| / |b| over every tensor of reference at once: 2.0 where a is b summed over 2 ranks instead of averaged."""
    norm = sum((zeros_if_none(tensors.get(k), v).double() ** 2).sum() for k, v in reference.items())
    return float((norm / sum((v.double() ** 2).sum() for v in reference.values())).sqrt())


def zeros_if_none(tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if tensor is None or tensor.shape != like.shape else tensor


def gathered(ranks: list[dict], sharded: set) -> dict:
    """One optimizer step's gradients from every rank's record (labs.patching.watch_training), as whole parameters:
    a sharded one's shards put back together in rank order (FSDP2 shards dim 0), a whole one's from rank 0."""
    return {name: torch.cat([rank[name] for rank in ranks]) if name in sharded else ranks[0][name]
            for name in ranks[0]}


def first_difference(alone: dict, pair: list[dict], tolerance: float) -> tuple[str, int, float] | None:
    """How the ranks' optimizer steps first differ from the reference's: ("ranks differ", step, _) where a whole
    parameter's gradient is not the same on both ranks, ("factor", step, ratio) where the gradients are a multiple
    of the reference's, ("differ", step, relative difference), first ("steps", steps taken, _) where the number
    of optimizer steps differs; None if they do not."""
    sharded = set().union(*(rank["sharded"] for rank in pair))
    expected = [step["gradients"] for step in alone["steps"]]
    if len(pair[0]["gradients"]) != len(expected):
        return "steps", len(pair[0]["gradients"]), 0.0
    for step, (ours, *theirs) in enumerate(zip(expected, *(rank["gradients"] for rank in pair), strict=False)):
        whole = {name: tensor for name, tensor in theirs[1].items() if name not in sharded}
        if whole and relative_difference({k: theirs[0].get(k) for k in whole}, whole) > tolerance:
            return "ranks differ", step + 1, 0.0
        mine = gathered(theirs, sharded)
        if (difference := relative_difference(mine, ours)) > tolerance:
            ratio = norm_ratio(mine, ours)
            return ("factor", step + 1, ratio) if abs(ratio - round(ratio)) < 0.01 and round(ratio) > 1 else \
                ("differ", step + 1, difference)
    return None


def first_loss_difference(alone: dict, losses: list[float], tolerance: float) -> tuple[int, float, float] | None:
    """The first optimizer step whose loss (losses, one per step) is not the reference's: (step, the loss, the
    reference's loss); None if none is."""
    for step, (one, two) in enumerate(zip(alone["steps"], losses, strict=False)):
        if abs(one["loss"] - two) > tolerance:
            return step + 1, two, one["loss"]
    return None
