"""Lab 02: run lab 01's training loop on Ray Train, reporting a checkpoint every epoch, and resume a stopped run
from its last checkpoint, as 02-ray-train-ddp/train_ray_ddp.py does.

train() below is lab 01's solution without torchrun: no process group joined, no DDP. Write fit(), which runs
train_func on 2 Ray workers, train_func(), which runs train() in each, and the TODOs in train() (about 30 lines in
all). The check runs lab 01's solution under torchrun's environment for 3 epochs, then your fit() for 2 epochs,
then fit() for 3 epochs under the same run name, and compares what each trained, reported and kept:

    python -m labs.check 02

A solution: labs/solutions/02_train_func.py.
"""
import argparse  # noqa: F401 (yours to use)
import itertools
import tempfile  # noqa: F401
from pathlib import Path  # noqa: F401

import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig  # noqa: F401 (yours to use)
from ray.train.torch import TorchTrainer  # noqa: F401
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer
from common.checkpoints import load_checkpoint, save_checkpoint  # noqa: F401 (yours to use)


def fit(args, storage: str, name: str) -> ray.train.Result:
    """train_func on 2 Ray workers, in the run `name` under storage. Given the name of an earlier run there, Ray
    resumes it: its workers find the last checkpoint it reported."""
    # TODO 1: a TorchTrainer of train_func, with the flags as its config (vars(args)), 2 workers (ScalingConfig) and
    # the run's name and storage (RunConfig); fit it, and return the Result.


def train_func(config):
    """Runs in every worker. Ray has already started the process group and chosen the device."""
    # TODO 2: the flags back from the config (an argparse.Namespace), this worker's rank and the world size from
    # Ray's context (ray.train.get_context()), then train(): rank 0 writes the checkpoint for everyone.


def train(args, rank, world_size, master_process, device):
    data = load_data(args.data, args.data_dir, args.eval_images)
    micro_batch = args.batch_size // world_size  # the global batch, split over the processes
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    steps_per_epoch = args.steps_per_epoch

    torch.manual_seed(args.seed)
    model = build_model(args.model)
    # TODO 3: let Ray wrap the model in DDP (prepare_model; it also moves the model to this worker's device) and the
    # loader (prepare_data_loader; it moves every batch there, and keeps the sampler above, seeded with --seed).
    raw_model = getattr(model, "module", model)  # DDP's wrapper holds the model as .module
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)

    start_epoch, history = 0, []
    # TODO 4: a resumed run (or a worker group Ray restarted) starts after the epoch of the run's last checkpoint
    # (ray.train.get_checkpoint()), from everything the checkpoint holds (common.load_checkpoint reads it).

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
        state = dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), epoch=epoch,  # noqa: F841
                     history=history, model_preset=args.model)
        # TODO 5: hand Ray this epoch's metrics (history[-1]) and rank 0's checkpoint.pt of state (save_checkpoint
        # writes one into a folder); Ray copies the checkpoint into the run's storage.
