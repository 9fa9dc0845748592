"""Lab 01, solved: the training loop of 01-vanilla-pytorch-ddp/train_ddp.py, DDP by hand.

    python -m labs.check 01 --file labs/solutions/01_ddp.py
"""
import itertools

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer


def main(args) -> list[dict]:
    """Runs in each process that torchrun starts; returns each epoch's train loss and test accuracy."""
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        return train(args, rank, world_size, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


def train(args, rank, world_size, device) -> list[dict]:
    data = load_data(args.data, args.data_dir, args.eval_images)
    micro_batch = args.batch_size // world_size  # the global batch, split over the processes
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    steps_per_epoch = args.steps_per_epoch

    torch.manual_seed(args.seed)
    model = build_model(args.model).to(device)
    model = DistributedDataParallel(model)
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    history = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=device)
        for images, labels, ids in itertools.islice(train_loader, steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            images = augment_batch(images.to(device), ids.to(device), epoch, args.seed)
            loss = criterion(model(images), labels.to(device))
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum)  # every rank's loss, not just rank 0's
        train_loss = loss_sum.item() / steps_per_epoch / world_size
        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        dist.all_reduce(tally)  # each rank scored a disjoint shard of the test set
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted))
    return history
