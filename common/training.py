"""The recipe and its evaluation: the optimizer and its schedule, predictions and the test set's score. Each step's
training loop stays in its own script; what a run reports is common/reporting.py's, checkpoint files
common/checkpoints.py's."""
import math

import torch

from .data import normalize


def make_optimizer(model: torch.nn.Module, args, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only (not biases, norms, embeddings)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # By name, not by shape: FSDP1 shows each rank a flat 1-D slice of every parameter.
        skip = name.endswith(("bias", "class_token", "pos_embedding")) or ".ln" in name  # ln_1, ln_2, ln
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def make_scheduler(optimizer, args, steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to --lr, then cosine decay to zero at the last step."""
    total = args.epochs * steps_per_epoch
    warmup = max(1, round(args.warmup_epochs * steps_per_epoch))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def predict(model, images: torch.Tensor) -> torch.Tensor:
    """Class probabilities for a batch of uint8 images: the mean over each image and its mirror image.

    Flip test-time augmentation, as airbench does: the model trained on flipped images, so it sees
    two views of the same picture for one more forward pass. Chosen on the validation split: +1.1 to
    1.2 points after 10 epochs (benchmarks/published/archive/recipe-search/).
    """
    x = normalize(images)
    return (model(x).float().softmax(1) + model(x.flip(3)).float().softmax(1)) / 2


@torch.no_grad()
def evaluate(model, images, labels, device, rank=0, world_size=1, batch_size=500) -> torch.Tensor:
    """Returns [correct, counted] over this rank's shard of the test set (images rank::world_size).

    Every test image is counted exactly once across ranks, with no padded duplicates. Every rank
    runs the same number of forward passes (a short shard repeats its last image without counting
    it), because a sharded model (FSDP) needs all ranks in every forward.
    """
    model.eval()
    shard = torch.arange(len(labels))[rank::world_size]  # empty on a rank past the last image
    per_rank = math.ceil(len(labels) / world_size)
    counted = torch.arange(per_rank) < len(shard)
    # The filler: this shard's last image, or image 0 for a rank with none (fewer images than ranks).
    filler = shard[-1:] if len(shard) else torch.zeros(1, dtype=torch.int64)
    shard = torch.cat([shard, filler.expand(per_rank - len(shard))])
    result = torch.zeros(2, dtype=torch.int64, device=device)
    for start in range(0, per_rank, batch_size):
        index, keep = shard[start:start + batch_size], counted[start:start + batch_size].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            probabilities = predict(model, images[index].to(device))
        hits = probabilities.argmax(1) == labels[index].to(device)
        result += torch.stack([(hits & keep).sum(), keep.sum()])
    model.train()
    return result
