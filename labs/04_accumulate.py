"""Lab 04-accumulate: gradient accumulation under FSDP2, as 04-ray-train-fsdp2/train_ray_fsdp2.py does it.

The loader below already yields micro-batches (--grad-accum-steps of them make one rank's share of a batch), but
the loop steps the optimizer after every one. The check runs main() in 2 processes under a profiler, with 2
micro-batches per step, and compares every optimizer step's gradients and loss with 1 process training on whole
batches, unsharded; it also counts the reduce-scatters:

    python -m labs.check 04-accumulate

Write the TODO (about 8 lines; DDP's way of skipping a micro-batch's all-reduce is model.no_sync(), step 02). A
solution: labs/solutions/04_accumulate.py.
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
    for images, labels, ids in micro_batches:
        # TODO: one optimizer step per args.grad_accum_steps micro-batches, training what 1 process trains on whole
        # batches: the gradients zeroed at a step's first micro-batch and summed over its micro-batches, each
        # micro-batch's loss its share of the whole batch's mean, and FSDP2's reduce-scatter of the gradients only
        # in the backward that needs it (fully_shard's set_requires_gradient_sync).
        optimizer.zero_grad(set_to_none=True)
        images = augment_batch(images, ids, 0, args.seed)
        loss = criterion(model(images), labels)
        loss.backward()
        loss_sum += loss.detach()
        optimizer.step()
        dist.all_reduce(loss_sum)  # every rank's loss, not just this one's
        losses.append(loss_sum.item() / world_size)
        loss_sum = torch.zeros(())
    return losses
