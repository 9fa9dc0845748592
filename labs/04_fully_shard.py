"""Lab 04: shard the model with FSDP2, as 04-ray-train-fsdp2/train_ray_fsdp2.py does (its shard_model).

The check runs main() in 2 processes (a gloo group on CPUs: FSDP2 works there too) and in 1 without sharding, and
compares what each rank holds, what they trained and how often they gathered parameters:

    python -m labs.check 04

Write shard_model (about 5 lines); the rest stays as it is. A solution: labs/solutions/04_fully_shard.py.
"""
import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard  # noqa: F401 (yours to use)
from torch.utils.data import DataLoader, DistributedSampler

from common.model import TRANSFORMER_BLOCK  # noqa: F401 (yours to use)
from common.data import augment_batch, load_data
from common.model import build_model
from common.training import make_optimizer


def shard_model(model, mesh) -> None:
    """FSDP2: each transformer block its own unit, gathered just before it runs and resharded after; then the
    root, which keeps what is left (stem, class token, final norm, head)."""
    # TODO: shard each TRANSFORMER_BLOCK over the mesh, then the model itself (about 5 lines). After forward, a
    # unit frees its gathered weights or keeps them for backward (fully_shard's reshard_after_forward): which
    # should the blocks do, and the root, whose weights backward needs first? The check counts the all-gathers.


def main(args) -> list[float]:
    """Runs in each process; returns each step's train loss, averaged over the ranks."""
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
    train_loader = DataLoader(train_set, batch_size=args.batch_size // world_size, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    model = build_model(args.model)  # whole on every rank, the same seeded weights: each keeps its slices
    shard_model(model, init_device_mesh("cpu", (world_size,)))
    optimizer = make_optimizer(model, args, torch.device("cpu"))  # after sharding: it steps the shards
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    losses = []
    for images, labels, ids in itertools.islice(train_loader, args.steps_per_epoch):
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(augment_batch(images, ids, 0, args.seed)), labels)
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss := loss.detach())  # every rank's loss, not just this one's
        losses.append(loss.item() / world_size)
    return losses
