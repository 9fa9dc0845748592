"""Lab 01: make this single-process training loop distributed, DDP by hand (step 01, train_ddp.py).

The check starts main() in 2 processes, with the environment torchrun gives them (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), and in 1 process, then compares what they trained and reported:

    python -m labs.check 01

Write the four TODOs (about 10 lines); the rest stays as it is. A solution: labs/solutions/01_ddp.py.
"""
import itertools
import os

import torch
import torch.distributed as dist  # noqa: F401 (yours to use)
from torch.nn.parallel import DistributedDataParallel  # noqa: F401 (yours to use)
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler  # noqa: F401

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer


def main(args) -> list[dict]:
    """Runs in each process that torchrun starts; returns each epoch's train loss and test accuracy."""
    # TODO 1: join the process group of the processes torchrun started (gloo on CPUs, nccl on GPUs), take this
    # process's rank and the world size from it, and leave the group when training ends.
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return train(args, rank, world_size, torch.device("cpu"))


def train(args, rank, world_size, device) -> list[dict]:
    data = load_data(args.data, args.data_dir, args.eval_images)
    micro_batch = args.batch_size // world_size  # the global batch, split over the processes
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    # TODO 2: give each rank its own disjoint shard of the training set, shuffled with args.seed.
    shuffle = torch.Generator()
    sampler = RandomSampler(train_set, generator=shuffle)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    steps_per_epoch = args.steps_per_epoch

    torch.manual_seed(args.seed)
    model = build_model(args.model).to(device)
    # TODO 3: make backward average the gradients over the ranks, so that every rank takes the same step.
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    history = []
    for epoch in range(args.epochs):
        # TODO 2 (continued): a new order every epoch, from your sampler.
        shuffle.manual_seed(args.seed + epoch)
        loss_sum = torch.zeros((), device=device)
        for images, labels, ids in itertools.islice(train_loader, steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            images = augment_batch(images.to(device), ids.to(device), epoch, args.seed)
            loss = criterion(model(images), labels.to(device))
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        # TODO 4: report the mean loss over every rank's images, not only this rank's ...
        train_loss = loss_sum.item() / steps_per_epoch
        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        # ... and the accuracy over the whole test set: each rank scored its own shard of it, [correct, counted].
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted))
    return history
