"""Hang clinic 2, solved: DistributedSampler gives every rank an equal shard (drop_last: no rank runs a step more),
each step's batch split over the ranks, as 1 process's.

    python -m labs.check hang-uneven --file labs/solutions/07_hang_uneven.py
"""
import itertools

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer

# The rank that runs a step the other rank never runs, the collective it waits in there (as torch.distributed names
# it), and the line in this file where it waits (its number, or the statement a traceback prints under it).
DIAGNOSIS = dict(rank=0, collective="all_reduce", line="loss.backward()")


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
        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        dist.reduce(tally, dst=0)  # [correct, counted] of every rank's shard of the test set, summed on rank 0
        dist.reduce(loss_sum, dst=0)  # the losses summed on rank 0, which writes the log
        if rank == 0:
            correct, counted = tally.tolist()
            history.append(dict(epoch=epoch + 1, train_loss=loss_sum.item() / args.steps_per_epoch / world_size,
                                test_accuracy=correct / counted))
    return history
