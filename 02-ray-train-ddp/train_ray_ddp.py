"""Step 02: the same training, run by Ray Train on a laptop or a cluster, with fault tolerance.

    python 02-ray-train-ddp/train_ray_ddp.py --num-workers 2 --epochs 1

The lesson, and what to diff this file against: README.md in this folder.
"""
import argparse
import contextlib
import itertools
import tempfile
import time
from pathlib import Path

import ray.train.torch  # also imports ray and ray.train
import torch
import torch.distributed as dist
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader, DistributedSampler

import common
from common.checkpoints import load_checkpoint, save_checkpoint
from common.data import augment_batch, load_data
from common.faults import crash_one_worker
from common.flags import add_ray_flags, make_parser
from common.meter import RunMeter, print_run_summary
from common.model import build_model, count_params
from common.ray_setup import check_cluster_and_choose_gpu, init_options, progress_bar, worker_setup
from common.reporting import epoch_line, gather_from_ranks, peak_memory_mb, this_node
from common.runs import print_best, run_folder, run_name
from common.training import evaluate, make_optimizer, make_scheduler

STEP = "ray_ddp"


def main():
    args = add_ray_flags(make_parser(__doc__, STEP), local_mode=True).parse_args()
    load_data(args.data, args.data_dir, args.eval_images)  # fail here, not in a worker (retried)
    name = run_name(STEP, args)  # --resume: the newest run's; Ray resumes a run given its name
    if args.num_workers:  # 0: Ray Train's local mode, for debugging (README.md in this folder)
        # Starts Ray on this machine, or joins the cluster at --address. Workers on other nodes
        # import common/ from the copy that the job's runtime_env ships them (its folder: under
        # `ray job submit` ray.init deep-copies runtime_env, which a module object fails).
        # Not Ray's defaults (init_options): its own log lines off, the controller polling every
        # 0.2 s, not 2 s (each report waits for a poll). README.md in step 02: Console.
        ray.init(address=args.address, **init_options(args.address),
                 runtime_env={"py_modules": common.__path__, **worker_setup()})
    use_gpu = check_cluster_and_choose_gpu(args)
    trainer = TorchTrainer(
        train_func,
        train_loop_config=vars(args),
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(
            name=name, storage_path=args.checkpoint_dir,  # a folder, or a URI such as s3://...
            failure_config=FailureConfig(max_failures=args.max_failures),
            logging_config=LoggingConfig(log_level="WARNING"),  # Ray Train's INFO lines: off
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_order="max",
                                               checkpoint_score_attribute="test_accuracy")))
    result = trainer.fit()
    print_best(result)  # the run's folder, and the best of the checkpoints it kept
    ray.shutdown()  # Ray prints its workers' lines whenever they come: none after the summary
    print_run_summary(f"{args.checkpoint_dir}/{name}", args.launched)  # memory per rank, then JSON


def train_func(config):
    """Runs in every worker. Ray has already started the process group and chosen the device."""
    args = argparse.Namespace(**config)
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    master_process = rank == 0  # prints, and writes the checkpoint for everyone
    train(args, rank, world_size, master_process, ray.train.torch.get_device())


def train(args, rank, world_size, master_process, device):
    # What the benchmarks read (start-up, time to first step, memory, --profile-steps'
    # profiler), stepped after every optimizer step; saved after every epoch (common/meter.py).
    meter = RunMeter(STEP, args, rank, device, run_folder(args))
    data = load_data(args.data, args.data_dir, args.eval_images)
    # The global batch, split over the processes, then into --grad-accum-steps micro-batches.
    micro_batch = args.batch_size // world_size // args.grad_accum_steps  # checked by the parser
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    # Each rank gets a disjoint 1/world_size of the data: rank r takes every world_size-th index.
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    # prepare_data_loader moves every batch to this worker's device, and keeps our sampler (its own
    # would be seeded with 0 whatever --seed says, and pad the last batches with repeated images).
    train_loader = ray.train.torch.prepare_data_loader(train_loader)
    full_epoch = len(train_loader) // args.grad_accum_steps  # optimizer steps
    steps_per_epoch = min(full_epoch, args.steps_per_epoch or full_epoch)
    micro_steps = steps_per_epoch * args.grad_accum_steps

    torch.manual_seed(args.seed)
    model = build_model(args.model)
    params = count_params(model)
    # Moves the model to this worker's device and wraps it in DDP (only if there are 2+ workers).
    model = ray.train.torch.prepare_model(model)
    raw_model = getattr(model, "module", model)
    optimizer = make_optimizer(model, args, device)
    scheduler = make_scheduler(optimizer, args, steps_per_epoch)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    nodes = gather_from_ranks(this_node())
    if master_process:
        print(f"model {args.model}: {params:,} parameters | data: {data.description} | "
              f"{world_size} x {device.type} on {len(set(nodes))} node(s), "
              f"{micro_batch} x {args.grad_accum_steps} images per step each")

    start_epoch, history = 0, []
    # A checkpoint is there after Ray restarted the worker group, or when a run is resumed.
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as checkpoint_dir:
            state = load_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", args)
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start_epoch, history = state["epoch"] + 1, state["history"]
        if master_process:
            print(f"resumed from {checkpoint.path} after epoch {start_epoch}")

    for epoch in range(start_epoch, args.epochs):
        # Without this every epoch repeats epoch 0's order: the sampler shuffles with seed + epoch.
        sampler.set_epoch(epoch)
        epoch_start = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        batches = itertools.islice(train_loader, micro_steps)
        progress = progress_bar(batches, micro_steps, f"epoch {epoch + 1}", show=master_process)
        for i, (images, labels, ids) in enumerate(progress):
            if i % args.grad_accum_steps == 0:  # the first micro-batch of an optimizer step
                optimizer.zero_grad(set_to_none=True)
            last_micro_batch = (i + 1) % args.grad_accum_steps == 0  # then an optimizer step
            images = augment_batch(images, ids, epoch, args.seed)  # on the device: Ray moved them
            # DDP all-reduces the gradients in every backward: until the last micro-batch, skip it.
            # (With one worker prepare_model does not wrap the model: nothing to skip.)
            no_sync = getattr(model, "no_sync", contextlib.nullcontext)
            with contextlib.nullcontext() if last_micro_batch else no_sync():
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
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            checkpoint = None
            if master_process:
                save_checkpoint(Path(checkpoint_dir) / "checkpoint.pt", state)
                checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
                checkpoint.set_metadata(dict(model_preset=args.model, epoch=epoch + 1))
            # Ray keeps rank 0's metrics only (reduced over ranks above) and copies the checkpoint
            # to storage. A barrier: every rank must call report, and equally often.
            ray.train.report(history[-1], checkpoint=checkpoint)
        if epoch + 1 == args.fail_at_epoch:  # practice: Ray restarts the group from this checkpoint
            crash_one_worker(rank, world_size)


if __name__ == "__main__":
    main()
