"""Lab 07, solved: the tensor parallelism of 07-tensor-parallel/train_ray_tp.py (its TP_PLAN and parallelize).

    python -m labs.check 07 --file labs/solutions/07_tp_plan.py
"""
import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import TRANSFORMER_BLOCK
from common.model import build_model, split_attention
from common.training import make_optimizer

# Megatron-LM's split of every block: a column-wise layer (each rank computes some of its outputs:
# some heads, some MLP units) feeds a row-wise one (each rank multiplies its share of the inputs,
# and an all-reduce sums the shares into the block's whole output). One all-reduce forward per
# pair, and one backward for the input's gradient of each column-wise layer.
TP_PLAN = {
    "self_attention.q": ColwiseParallel(),  # q, k and v: each rank computes its heads' ...
    "self_attention.k": ColwiseParallel(),
    "self_attention.v": ColwiseParallel(),
    "self_attention.out_proj": RowwiseParallel(),  # ... and projects them: an all-reduce sums
    "mlp.0": ColwiseParallel(),  # the MLP's first layer: each rank its units (GELU is per unit)
    "mlp.3": RowwiseParallel(),  # its second: an all-reduce sums the ranks' shares
}


def parallelize(model, mesh) -> None:
    """Every transformer block split by TP_PLAN over the mesh's ranks; the rest stays whole on every rank."""
    for module in model.modules():
        if isinstance(module, TRANSFORMER_BLOCK):
            parallelize_module(module, mesh, TP_PLAN)


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
