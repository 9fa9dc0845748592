"""Lab 07: split every transformer block across 2 ranks with tensor parallelism, as
07-tensor-parallel/train_ray_tp.py does (its TP_PLAN and parallelize).

The check runs main() in 2 processes (a gloo group on CPUs: DTensor works there too) and in 1 without splitting, and
compares what each rank holds, what they trained and how often they all-reduced:

    python -m labs.check 07

Write TP_PLAN and parallelize (about 10 lines); the rest stays as it is. A solution: labs/solutions/07_tp_plan.py.
"""
import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,  # noqa: F401 (yours to use)
                                               parallelize_module)
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import TRANSFORMER_BLOCK  # noqa: F401 (yours to use)
from common.model import build_model, split_attention
from common.training import make_optimizer

# TODO: the plan of one block, {a Linear's name inside the block: ColwiseParallel() or
# RowwiseParallel()}. The block's Linear layers: self_attention.q, self_attention.k and
# self_attention.v (each width -> width: its outputs the heads, one after another),
# self_attention.out_proj (the heads -> width), mlp.0 (width -> the MLP's units) and mlp.3 (the
# units -> width). Which split of each lets every rank compute on its own share, and the block hand
# on a whole output with one all-reduce per pair? The check counts the all-reduces.
TP_PLAN = {}


def parallelize(model, mesh) -> None:
    """Every transformer block split by TP_PLAN over the mesh's ranks; the rest stays whole on every rank."""
    # TODO: apply TP_PLAN to each TRANSFORMER_BLOCK of the model (about 3 lines).


def main(args) -> list[float]:
    """Runs in each process; returns each step's train loss."""
    dist.init_process_group(backend="gloo")
    try:
        return train(args, dist.get_world_size())
    finally:
        dist.destroy_process_group()


def train(args, world_size) -> list[float]:
    data = load_data(args.data, args.data_dir, args.eval_images)
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    # The ranks of a TP group compute parts of the same activations: they take the same images, the
    # whole batch (one dp group: step 07 splits the data over dp groups only).
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=args.seed,
                                 drop_last=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    # whole on every rank, the same seeded weights: each keeps its slices
    model = split_attention(build_model(args.model))  # q, k and v apart: each splits by heads
    parallelize(model, init_device_mesh("cpu", (world_size,)))
    optimizer = make_optimizer(model, args, torch.device("cpu"))  # after: it steps this rank's slices
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    losses = []
    for images, labels, ids in itertools.islice(train_loader, args.steps_per_epoch):
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(augment_batch(images, ids, 0, args.seed)), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # every rank of a TP group computed the same loss
    return losses
