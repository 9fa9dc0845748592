"""Hang clinic 3, solved: every rank gathers batches of one shape, its shard padded to the longest shard's length,
and the padding (-1) is not counted.

    python -m labs.check hang-shape --file labs/solutions/07_hang_shape.py
"""
import itertools
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import make_optimizer, predict

EVAL_BATCH = 64

# The rank whose tensor has another shape than the other rank's, that collective (as torch.distributed names it),
# and the line in this file where it is called (its number, or the statement a traceback prints under it).
DIAGNOSIS = dict(rank=1, collective="all_gather", line="dist.all_gather(everyone, mine)")


def main(args) -> list[dict]:
    """Runs in each of 2 processes; returns each epoch's train loss and test accuracy (rank 0's log)."""
    dist.init_process_group("gloo")
    try:
        return train(args, dist.get_rank(), dist.get_world_size(), torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def train(args, rank, world_size, device) -> list[dict]:
    data = load_data(args.data, args.data_dir, args.eval_images)
    train_set = data.train_set()
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size // world_size, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(build_model(args.model).to(device))
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    history = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=device)
        for images, labels, ids in itertools.islice(train_loader, args.steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            images = augment_batch(images.to(device), ids.to(device), epoch, args.seed)
            loss = criterion(model(images), labels.to(device))
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        dist.reduce(loss_sum, dst=0)  # the losses summed on rank 0, which writes the log
        accuracy = evaluate(model, data.test_images, data.test_labels, rank, world_size)
        if rank == 0:
            history.append(dict(epoch=epoch + 1, train_loss=loss_sum.item() / args.steps_per_epoch / world_size,
                                test_accuracy=accuracy))
    return history


@torch.no_grad()
def evaluate(model, images, labels, rank, world_size) -> float:
    """The accuracy over the whole test set, on rank 0: each rank predicts its shard (images rank::world_size), a
    batch at a time, and every rank's hits are gathered."""
    model.eval()
    shard = torch.arange(len(labels))[rank::world_size]
    padded = torch.full((math.ceil(len(labels) / world_size),), -1)  # the longest shard's length, on every rank
    padded[:len(shard)] = shard
    hits = []
    for batch in padded.split(EVAL_BATCH):  # the same shapes on every rank
        mine = (predict(model, images[batch.clamp(min=0)]).argmax(1) == labels[batch.clamp(min=0)]).long()
        mine[batch < 0] = -1  # padding: no image
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        hits += everyone
    model.train()
    hits = torch.cat(hits)
    return (hits == 1).sum().item() / (hits >= 0).sum().item()
