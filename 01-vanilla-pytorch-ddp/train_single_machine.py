"""Step 01a: the baseline. A Vision Transformer learns CIFAR-10 on one device (a GPU if any).

    python 01-vanilla-pytorch-ddp/train_single_machine.py --epochs 1

The lesson, and what to diff this file against: README.md in this folder.
"""
import itertools
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, RandomSampler
from tqdm import tqdm

from common.checkpoints import load_checkpoint, save_checkpoint
from common.data import augment_batch, load_data
from common.faults import crash_one_rank
from common.flags import make_parser
from common.meter import RunMeter, print_run_summary
from common.model import build_model, count_params
from common.reporting import epoch_line, gather_from_ranks, peak_memory_mb, this_node
from common.training import evaluate, make_optimizer, make_scheduler

STEP = "single_machine"


def main():
    args = make_parser(__doc__, STEP).parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train(args, rank=0, world_size=1, master_process=True, device=device)


def train(args, rank, world_size, master_process, device):
    # What the benchmarks read (start-up, time to first step, memory, --profile-steps'
    # profiler), stepped after every optimizer step; saved after every epoch (common/meter.py).
    meter = RunMeter(STEP, args, rank, device, args.checkpoint_dir)
    data = load_data(args.data, args.data_dir, args.eval_images)
    # The global batch, split over the processes, then into --grad-accum-steps micro-batches.
    micro_batch = args.batch_size // world_size // args.grad_accum_steps  # checked by the parser
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    shuffle = torch.Generator()
    sampler = RandomSampler(train_set, generator=shuffle)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    full_epoch = len(train_loader) // args.grad_accum_steps  # optimizer steps
    steps_per_epoch = min(full_epoch, args.steps_per_epoch or full_epoch)
    micro_steps = steps_per_epoch * args.grad_accum_steps

    torch.manual_seed(args.seed)
    model = build_model(args.model).to(device)
    params = count_params(model)
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
    if args.resume:
        state = load_checkpoint(checkpoint_path, args)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        if master_process:
            print(f"resumed from {checkpoint_path} after epoch {start_epoch}")

    for epoch in range(start_epoch, args.epochs):
        # Reseeded every epoch: a new order each epoch, the same order when resumed.
        shuffle.manual_seed(args.seed + epoch)
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
        train_loss = loss_sum.item() / steps_per_epoch  # .item() waits for the GPU: honest time
        epoch_seconds = time.perf_counter() - epoch_start

        correct, counted = evaluate(model, data.test_images, data.test_labels, device).tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted,
                            epoch_time_s=epoch_seconds, world_size=world_size,
                            images_per_s=steps_per_epoch * args.batch_size / epoch_seconds))
        if master_process:
            print(epoch_line(history[-1], args.epochs, peak_memory_mb(device)))
        meter.save_summary(history)  # a collective; rank 0 writes summary.json in the run's folder
        state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), epoch=epoch,
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
