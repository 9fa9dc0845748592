"""Step 02, fed by Ray Data: train_ray_ddp.py with the DataLoader replaced by a Ray Dataset.

    python 02-ray-train-ddp/train_ray_ddp_with_ray_data.py --num-workers 2 --model tiny --epochs 1

The driver turns the uint8 training arrays into a Ray Dataset and hands it to TorchTrainer as
datasets={"train": ...}; Ray Train splits it into one stream per worker, and each worker reads its
stream with get_dataset_shard("train").iter_torch_batches(...). Augmentation stays batched on the
device, as in every step.

When Ray Data pays off: when preparing the data costs real CPU work (decoding JPEGs, resizing,
tokenising) that would starve the GPUs, because Ray Data runs it as tasks on any node's CPUs,
CPU-only nodes included, and streams the results to the GPU workers; and when the data is bigger
than memory, because it streams blocks from storage (read_parquet, read_images, ...) instead of
holding everything in every worker. When it does not: CIFAR-10 is 150 MB of ready-made uint8
arrays that fit in every worker's memory, and the only preprocessing runs on the device. Here Ray
Data only adds copies through the object store and a per-epoch start-up, so expect this script to
be no faster than train_ray_ddp.py; it shows the pattern, for the day the data outgrows memory.
"""
import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

import ray
import ray.data
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from tqdm import tqdm

from common import build_model, count_params, load_data, make_parser
from common import augment_batch, evaluate, make_optimizer, make_scheduler
from common import epoch_line, gather_from_ranks, memory_table, peak_memory_mb, state_memory_mb
from common import load_checkpoint, save_checkpoint
from common.ray_setup import add_ray_flags, check_cluster_and_choose_gpu, quiet_report_logs, run_name, start_ray

STEP = "ray_ddp_data"


def main():
    args = add_ray_flags(make_parser(__doc__, STEP)).parse_args()
    data = load_data(args.data, args.data_dir, args.eval_images)  # fail here, not in the workers (Ray would retry)
    name = run_name(STEP, args)  # with --resume, the newest run's: Ray restores a run given its name again
    start_ray(args.address)
    use_gpu = check_cluster_and_choose_gpu(args)
    trainer = TorchTrainer(
        train_func,
        train_loop_config=vars(args),
        # Ray Train splits every dataset here into one stream per worker, all of the same length.
        datasets={"train": train_dataset(data, args.seed)},
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(
            name=name, storage_path=args.checkpoint_dir,  # an absolute path, or a URI such as s3://bucket/runs
            failure_config=FailureConfig(max_failures=args.max_failures),
            logging_config=LoggingConfig(log_level="WARNING"),  # Ray Train's own INFO lines, not yours
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="test_accuracy",
                                               checkpoint_score_order="max")))
    result = trainer.fit()
    best_checkpoint, best_metrics = result.best_checkpoints[-1]
    print(f"run {result.path}: best checkpoint {best_checkpoint.path} "
          f"(epoch {best_metrics['epoch']}, test acc {best_metrics['test_accuracy']:.2%})")
    print(memory_table(result.metrics["summary"]["memory_per_rank"]))
    print(json.dumps(dict(result.metrics["summary"], wall_time_s=time.time() - args.launched)))


def train_dataset(data, seed):
    """The training set as a Ray Dataset of rows {image (3, 32, 32) uint8, label, id}, in the object store.

    Shuffled without random_shuffle(): a full shuffle runs as Ray tasks that each need a CPU, and
    when the training workers hold every CPU (2 workers on 2 cores) it waits forever. Instead, the
    blocks (a few hundred images each) come in a new order every epoch, and a shuffle buffer in
    each worker mixes rows of several blocks. Reproducible: the same --seed gives the same orders,
    as long as streaming_split deals the blocks to the workers the same way (it can vary with
    timing and node placement). Not reproducible: a restarted or resumed run counts epochs for
    Ray Data from zero again; and these orders are not the DistributedSampler's, so this script
    does not reproduce train_ray_ddp.py's weights, only its accuracy up to noise.
    """
    # The dataset copies the current DataContext, so set it first. The actor that splits the data
    # would otherwise draw progress bars and print its plan on this console, every epoch.
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = context.print_on_execution_start = False
    rows = [dict(image=image, label=label, id=i)
            for i, (image, label) in enumerate(zip(data.train_images.numpy(), data.train_labels.numpy(), strict=True))]
    # RandomSeedConfig reseeds at every execution (epoch); a plain int seed would repeat one order.
    return ray.data.from_items(rows).randomize_block_order(seed=ray.data.RandomSeedConfig(seed=seed))


def train_func(config):
    """Runs in every worker. Ray has already started the process group and chosen the device."""
    quiet_report_logs()
    args = argparse.Namespace(**config)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    master_process = rank == 0  # prints, and writes the checkpoint for everyone
    train(args, rank, world_size, master_process, ray.train.torch.get_device())


def train(args, rank, world_size, master_process, device):
    # When each start-up phase ended: all that ran before train() (torchrun's process group, or Ray and its
    # workers), loading the data, building the model. The summary reports them as seconds from launch.
    startup = dict(launcher=time.time())
    data = load_data(args.data, args.data_dir, args.eval_images)  # test set and N: training batches come from Ray Data
    batch_size = args.batch_size // world_size  # global batch split evenly: checked when the flags were parsed
    # This worker's stream of the "train" dataset: a disjoint floor(N / world_size) rows every epoch.
    train_shard = ray.train.get_dataset_shard("train")
    # DDP needs every rank to run the same number of steps (one extra batch on one rank would hang the
    # all-reduce): all stop after N // global batch, the full batches in each stream, or --steps-per-epoch.
    full_epoch = len(data.train_labels) // args.batch_size
    steps_per_epoch = min(full_epoch, args.steps_per_epoch or full_epoch)
    startup["data"] = time.time()

    torch.manual_seed(args.seed)
    model = build_model(args.model)
    params = count_params(model)
    # Moves the model to this worker's device and wraps it in DDP (only when there are several workers).
    model = ray.train.torch.prepare_model(model)
    raw_model = getattr(model, "module", model)
    optimizer = make_optimizer(model, args, device)
    scheduler = make_scheduler(optimizer, args, steps_per_epoch)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    nodes = gather_from_ranks(ray.get_runtime_context().get_node_id())
    if master_process:
        print(f"model {args.model}: {params:,} parameters | data: {data.description} | "
              f"{world_size} x {device.type} on {len(set(nodes))} node(s), {batch_size} images per step each")

    start_epoch, history = 0, []
    # A checkpoint is there after Ray restarted a failed worker group, or when this run was resumed.
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as checkpoint_dir:
            state = load_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", args)
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        if master_process:
            print(f"resumed from {checkpoint.path} after epoch {start_epoch}")

    startup["model"] = time.time()
    time_to_first_step, train_seconds, images_trained = None, 0.0, 0
    for epoch in range(start_epoch, args.epochs):
        epoch_start = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        # Each call starts a new epoch of the stream (all workers must call it). The shuffle buffer mixes
        # rows of several blocks, so batches are not the same groups of images every epoch.
        batches = itertools.islice(train_shard.iter_torch_batches(
            batch_size=batch_size, device=device, drop_last=True, local_shuffle_buffer_size=4 * batch_size,
            local_shuffle_seed=args.seed + epoch), steps_per_epoch)
        for batch in tqdm(batches, total=steps_per_epoch, desc=f"epoch {epoch + 1}",
                          leave=False, disable=not master_process):
            # Still uint8 and already on the device; the sample ids travel with the batch: augment_batch
            # derives its randomness from them.
            images = augment_batch(batch["image"], batch["id"], epoch, args.seed)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = criterion(model(images), batch["label"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.detach()
            time_to_first_step = time_to_first_step or time.time() - args.launched
        dist.all_reduce(loss_sum)  # every rank's loss, not just rank 0's
        train_loss = loss_sum.item() / steps_per_epoch / world_size  # .item() waits for the GPU: time is honest
        epoch_seconds = time.perf_counter() - epoch_start
        train_seconds += epoch_seconds
        images_trained += steps_per_epoch * args.batch_size
        state_memory = state_memory_mb(model, optimizer)  # parameters, gradients, optimizer state on this rank

        tally = evaluate(model, data.test_images, data.test_labels, device, rank, world_size)
        dist.all_reduce(tally)  # each rank scored a disjoint shard of the test set
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted,
                            epoch_time_s=epoch_seconds, images_per_s=steps_per_epoch * args.batch_size / epoch_seconds))
        if master_process:
            print(epoch_line(epoch, args.epochs, train_loss, correct / counted, epoch_seconds,
                             history[-1]["images_per_s"], peak_memory_mb(device)))
        memory = gather_from_ranks(dict(state_memory, peak_mb=peak_memory_mb(device)))
        # The run so far, as the last line of output will report it.
        summary = dict(
            step=STEP, world_size=world_size, device=device.type, model=args.model, params=params, data=args.data,
            epochs=args.epochs, global_batch_size=args.batch_size, train_loss=history[-1]["train_loss"],
            test_accuracy=history[-1]["test_accuracy"],
            images_per_s=images_trained / train_seconds if train_seconds else None,
            time_to_first_step_s=time_to_first_step, peak_memory_mb=[m["peak_mb"] for m in memory],
            startup_s={phase: t - args.launched for phase, t in startup.items()},
            memory_per_rank=memory, nodes=len(set(nodes)), history=history)
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            checkpoint = None
            if master_process:
                save_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", dict(
                    model=raw_model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                    epoch=epoch, history=history, model_preset=args.model))
                checkpoint = Checkpoint.from_directory(checkpoint_dir)
                checkpoint.set_metadata(dict(model_preset=args.model, epoch=epoch + 1))
            # Ray keeps rank 0's metrics only (reduced over ranks above) and copies the checkpoint to storage.
            # A barrier: every rank must call report, and equally often.
            ray.train.report(dict(history[-1], summary=summary), checkpoint=checkpoint)
        if epoch + 1 == args.fail_at_epoch and rank == world_size - 1:
            # Ray's controller registers a reported checkpoint when it next polls the workers: crash well after
            # that, or Ray restarts from the checkpoint before.
            time.sleep(5 * float(os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]))
            os._exit(1)  # a hard crash, not an exception: Ray notices, restarts the group from the checkpoint


if __name__ == "__main__":
    main()
