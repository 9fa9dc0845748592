"""Lab 04-accumulate, solved: gradient accumulation under FSDP2, as in 04-ray-train-fsdp2/train_ray_fsdp2.py.

    python -m labs.check 04-accumulate --file labs/solutions/04_accumulate.py
"""
import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from common.model import TRANSFORMER_BLOCK
from common.data import augment_batch, load_data
from common.model import build_model
from common.training import make_optimizer


def shard_model(model, mesh) -> None:
    """FSDP2 (lab 04): each transformer block a unit, then the root."""
    for module in model.modules():
        if isinstance(module, TRANSFORMER_BLOCK):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)


def main(args) -> list[float]:
    """Runs in each process; returns each optimizer step's train loss, averaged over the ranks."""
    dist.init_process_group(backend="gloo")
    try:
        return train(args, dist.get_rank(), dist.get_world_size())
    finally:
        dist.destroy_process_group()


def train(args, rank, world_size) -> list[float]:
    data = load_data(args.data, args.data_dir, args.eval_images)
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    # The global batch, split over the processes, then into --grad-accum-steps micro-batches.
    micro_batch = args.batch_size // world_size // args.grad_accum_steps
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    model = build_model(args.model)  # whole on every rank, the same seeded weights: each keeps its slices
    shard_model(model, init_device_mesh("cpu", (world_size,)))
    optimizer = make_optimizer(model, args, torch.device("cpu"))  # after sharding: it steps the shards
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    losses, loss_sum = [], torch.zeros(())
    micro_batches = itertools.islice(train_loader, args.steps_per_epoch * args.grad_accum_steps)
    for i, (images, labels, ids) in enumerate(micro_batches):
        if i % args.grad_accum_steps == 0:  # the first micro-batch of an optimizer step
            optimizer.zero_grad(set_to_none=True)
        last_micro_batch = (i + 1) % args.grad_accum_steps == 0  # then an optimizer step
        images = augment_batch(images, ids, 0, args.seed)
        # FSDP2 reduce-scatters the gradients in every backward: until the last micro-batch, skip it
        # (this rank keeps the unsharded gradients meanwhile).
        model.set_requires_gradient_sync(last_micro_batch)
        # Each micro-batch's share of the mean loss over the whole batch.
        loss = criterion(model(images), labels) / args.grad_accum_steps
        loss.backward()  # adds this micro-batch's gradients to those before it
        loss_sum += loss.detach()
        if not last_micro_batch:
            continue
        optimizer.step()
        dist.all_reduce(loss_sum)  # every rank's loss, not just this one's
        losses.append(loss_sum.item() / world_size)
        loss_sum = torch.zeros(())
    return losses
