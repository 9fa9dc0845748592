"""Hang clinic 2: the run stops in its first epoch. Find which rank waits on which collective, write it down, fix it.

    python -m labs.check hang-uneven

The epoch's images come in files, and each rank reads its share of the files, as a streaming data pipeline does.
The check runs main() in 2 processes whose collectives time out after 10 s, so the hang ends in an error. Climb
the ladder (TROUBLESHOOTING.md, "The run hangs: which rank waits on which collective"), in the order a
professional would:
1. the timeout's message and traceback: which line each rank was on when its collective gave up;
2. `dist.monitored_barrier(timeout=...)` before the suspect line (gloo only): it names the rank that never came;
3. `TORCH_DISTRIBUTED_DEBUG=DETAIL python -m labs.check hang-uneven`: each rank's op and shapes side by side;
4. `py-spy dump --pid PID` on each rank while it waits (`pgrep -f labs.check`: the check, then its 2 ranks; run it
   with LABS_HANG_TIMEOUT_S=120 to wait that long): the line of each stack.
(The Flight Recorder is NCCL's: on gloo nothing dumps it on a timeout, tests/test_hang_tools.py.)

Then fill in DIAGNOSIS (its line as this file numbers it, untouched or with your lines added above it)
and fix the code: every rank must take 1 process's steps, each on its half of 1 process's batch.
A solution: labs/solutions/07_hang_uneven.py.
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common.data import augment_batch, load_data
from common.model import build_model
from common.training import evaluate, make_optimizer

FILE_IMAGES = 48  # images per file: an epoch of 128 images is 3 files, the last one shorter

# The rank that runs a step the other rank never runs, the collective it waits in there (as torch.distributed names
# it), and the line in this file where it waits (its number, or the statement a traceback prints under it).
DIAGNOSIS = dict(rank=None, collective=None, line=None)


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
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(build_model(args.model).to(device))
    optimizer = make_optimizer(model, args, device)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    history = []
    for epoch in range(args.epochs):
        shuffle = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(train_set), generator=shuffle)[:args.steps_per_epoch * args.batch_size]
        files = order.split(FILE_IMAGES)
        mine = torch.cat(files[rank::world_size])  # each rank reads every world_size-th file
        loss_sum = torch.zeros((), device=device)
        for images, labels, ids in map(train_set.__getitem__, mine.split(args.batch_size // world_size)):
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
