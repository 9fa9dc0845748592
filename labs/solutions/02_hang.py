"""Lab 02-hang, solved: every rank reports, rank 0 alone with a checkpoint, as 02-ray-train-ddp/train_ray_ddp.py does.

    python -m labs.check 02-hang --file labs/solutions/02_hang.py
"""
import argparse
import itertools
import tempfile
from pathlib import Path

import ray
import ray.train.torch
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader, DistributedSampler

from common.data import augment_batch, load_data
from common.flags import make_parser
from common.model import build_model
from common.training import make_optimizer


def main():
    args = make_parser(__doc__, "lab").parse_args()
    ray.init()
    trainer = TorchTrainer(train_func, train_loop_config=vars(args), scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(storage_path=args.checkpoint_dir))
    print(trainer.fit().metrics)


def train_func(config):
    """Runs in each of the 2 Ray workers: an epoch of DDP training, then a report, per epoch."""
    args = argparse.Namespace(**config)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    master_process = rank == 0
    data = load_data(args.data, args.data_dir, args.eval_images)
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size // world_size, sampler=sampler, drop_last=True)
    torch.manual_seed(args.seed)
    model = ray.train.torch.prepare_model(build_model(args.model))  # DDP
    optimizer = make_optimizer(model, args, torch.device("cpu"))
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels, ids in itertools.islice(train_loader, args.steps_per_epoch):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(augment_batch(images, ids, epoch, args.seed)), labels)
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            checkpoint = None
            if master_process:
                torch.save(model.module.state_dict(), Path(checkpoint_dir) / "model.pt")
                checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
            # Ray keeps rank 0's metrics only and copies the checkpoint to storage. A barrier: every rank must
            # call report, and equally often.
            ray.train.report(dict(epoch=epoch + 1, train_loss=loss.item()), checkpoint=checkpoint)


if __name__ == "__main__":
    main()
