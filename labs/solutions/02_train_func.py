"""Lab 02, solved: the training loop of lab 01 run by Ray Train, as 02-ray-train-ddp/train_ray_ddp.py does it.

    python -m labs.check 02 --file labs/solutions/02_train_func.py
"""
import argparse
import itertools
import tempfile
from pathlib import Path

import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import build_model
from common.checkpoints import load_checkpoint, save_checkpoint
from common.training import evaluate, make_optimizer


def fit(args, storage: str, name: str) -> ray.train.Result:
    """train_func on 2 Ray workers. Given the name of an earlier run in storage, Ray resumes that run: its
    workers find the last checkpoint it reported."""
    trainer = TorchTrainer(train_func, train_loop_config=vars(args), scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, storage_path=storage))
    return trainer.fit()


def train_func(config):
    """Runs in every worker. Ray has already started the process group and chosen the device."""
    args = argparse.Namespace(**config)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    master_process = rank == 0  # writes the checkpoint for everyone
    train(args, rank, world_size, master_process, ray.train.torch.get_device())


def train(args, rank, world_size, master_process, device):
    data = load_data(args.data, args.data_dir, args.eval_images)
    micro_batch = args.batch_size // world_size  # the global batch, split over the processes
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    train_loader = ray.train.torch.prepare_data_loader(train_loader)
    steps_per_epoch = args.steps_per_epoch

    torch.manual_seed(args.seed)
    model = build_model(args.model)
    model = ray.train.torch.prepare_model(model)
    raw_model = getattr(model, "module", model)
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    start_epoch, history = 0, []
    # A checkpoint is there after Ray restarted a failed worker group, or when a run is resumed.
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as checkpoint_dir:
            state = load_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", args)
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, history = state["epoch"] + 1, state["history"]

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=device)
        for images, labels, ids in itertools.islice(train_loader, steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            images = augment_batch(images, ids, epoch, args.seed)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum)  # every rank's loss, not just rank 0's
        train_loss = loss_sum.item() / steps_per_epoch / world_size
        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        dist.all_reduce(tally)  # each rank scored a disjoint shard of the test set
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted))
        # What a checkpoint holds, as common.load_checkpoint reads it.
        state = dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), epoch=epoch,
                     history=history, model_preset=args.model)
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            checkpoint = None
            if master_process:
                save_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", state)
                checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
            # Ray keeps rank 0's metrics only (reduced over ranks above) and copies the checkpoint
            # to storage. A barrier: every rank must call report, and equally often.
            ray.train.report(history[-1], checkpoint=checkpoint)
