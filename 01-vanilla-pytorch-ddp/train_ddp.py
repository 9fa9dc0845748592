"""Step 01b: the same training, with DistributedDataParallel written by hand, under torchrun.

    torchrun --nproc_per_node=2 01-vanilla-pytorch-ddp/train_ddp.py --epochs 1

The lesson, and what to diff this file against: README.md in this folder.
"""
import contextlib
import itertools
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from common.checkpoints import load_checkpoint, save_checkpoint
from common.data import augment_batch, load_data
from common.faults import crash_one_rank
from common.flags import make_parser
from common.meter import RunMeter, print_run_summary
from common.model import build_model, count_params
from common.reporting import epoch_line, gather_from_ranks, peak_memory_mb, this_node
from common.training import evaluate, make_optimizer, make_scheduler

STEP = "ddp"


def main():
    args = make_parser(__doc__, STEP).parse_args()
    # torchrun starts one process per device and tells each who it is through the environment.
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    master_process = rank == 0  # prints, checkpoints and reports for everyone
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        train(args, rank, world_size, master_process, device)
    finally:
        dist.destroy_process_group()


def train(args, rank, world_size, master_process, device):
    # What the benchmarks read (start-up, time to first step, memory, --profile-steps'
    # profiler), stepped after every optimizer step; saved after every epoch (common/meter.py).
    meter = RunMeter(STEP, args, rank, device, args.checkpoint_dir)
    data = load_data(args.data, args.data_dir, args.eval_images)
    # The global batch, split over the processes, then into --grad-accum-steps micro-batches.
    micro_batch = args.batch_size // world_size // args.grad_accum_steps  # checked by the parser
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    # Each rank gets a disjoint 1/world_size of the data: rank r takes every world_size-th index.
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    full_epoch = len(train_loader) // args.grad_accum_steps  # optimizer steps
    steps_per_epoch = min(full_epoch, args.steps_per_epoch or full_epoch)
    micro_steps = steps_per_epoch * args.grad_accum_steps

    torch.manual_seed(args.seed)
    model = build_model(args.model).to(device)
    params = count_params(model)
    # DDP broadcasts rank 0's weights, then all-reduces (averages) gradients during backward.
    model = DistributedDataParallel(model)  # on a GPU: the device set_device chose
    raw_model = model.module  # the model inside the wrapper: what checkpoints hold
    optimizer = make_optimizer(model, args, device)
    scheduler = make_scheduler(optimizer, args, steps_per_epoch)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    nodes = gather_from_ranks(this_node())
    if master_process:
        print(f"model {args.model}: {params:,} parameters | data: {data.description} | "
              f"{world_size} x {device.type} on {len(set(nodes))} node(s), "
              f"{micro_batch} x {args.grad_accum_steps} images per step each")

    checkpoint_path = Path(args.checkpoint_dir) / "checkpoint.pt"
    start_epoch, history = 0, []
    # torchrun --max-restarts N starts every rank again after a crash, from the top: we resume.
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if args.resume or (restarted and checkpoint_path.exists()):
        state = load_checkpoint(checkpoint_path, args)
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        if master_process:
            print(f"resumed from {checkpoint_path} after epoch {start_epoch}")

    for epoch in range(start_epoch, args.epochs):
        # Without this every epoch repeats epoch 0's order: the sampler shuffles with seed + epoch.
        sampler.set_epoch(epoch)
        epoch_start = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        batches = itertools.islice(train_loader, micro_steps)
        progress = tqdm(batches, total=micro_steps, desc=f"epoch {epoch + 1}", leave=False,
                        disable=not master_process)
        for i, (images, labels, ids) in enumerate(progress):
            if i % args.grad_accum_steps == 0:  # the first micro-batch of an optimizer step
                optimizer.zero_grad(set_to_none=True)
            last_micro_batch = (i + 1) % args.grad_accum_steps == 0  # then an optimizer step
            images = augment_batch(images.to(device), ids.to(device), epoch, args.seed)
            labels = labels.to(device)
            # DDP all-reduces the gradients in every backward: until the last micro-batch, skip it.
            with contextlib.nullcontext() if last_micro_batch else model.no_sync():
                with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                    # Each micro-batch's share of the mean loss over the whole batch.
                    loss = criterion(model(images), labels) / args.grad_accum_steps
                loss.backward()  # adds this micro-batch's gradients to those before it
            loss_sum += loss.detach()
            if not last_micro_batch:
                continue
            optimizer.step()
            meter.step(optimizer)
            scheduler.step()
        dist.all_reduce(loss_sum)  # every rank's loss, not just rank 0's
        train_loss = loss_sum.item() / steps_per_epoch / world_size  # waits for the GPU: honest
        epoch_seconds = time.perf_counter() - epoch_start

        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        dist.all_reduce(tally)  # each rank scored a disjoint shard of the test set
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted,
                            epoch_time_s=epoch_seconds, world_size=world_size,
                            images_per_s=steps_per_epoch * args.batch_size / epoch_seconds))
        if master_process:
            print(epoch_line(history[-1], args.epochs, peak_memory_mb(device)))
        meter.save_summary(history)  # a collective; rank 0 writes summary.json in the run's folder
        state = dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), epoch=epoch,
                     scheduler=scheduler.state_dict(), history=history, model_preset=args.model)
        if master_process:
            save_checkpoint(checkpoint_path, state)
        if epoch + 1 == args.fail_at_epoch:  # practice: a crash, then a rerun with --resume
            crash_one_rank(epoch, checkpoint_path)

    if master_process:  # the next run here without --resume writes over it
        print(f"checkpoint: {checkpoint_path}")
        print_run_summary(args.checkpoint_dir, args.launched)  # memory per rank, then JSON


if __name__ == "__main__":
    main()
