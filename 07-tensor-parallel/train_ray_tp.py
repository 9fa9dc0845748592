"""Step 07: tensor parallelism. A TP group's workers split each block's matrices; FSDP2 across.

    python 07-tensor-parallel/train_ray_tp.py --num-workers 2 --epochs 1          # TP over 2
    python 07-tensor-parallel/train_ray_tp.py --num-workers 4 --tp 2 --epochs 1   # FSDP2 x TP

The lesson, and what to diff this file against: README.md in this folder.
"""
import argparse
import itertools
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ray.train.torch  # also imports ray and ray.train
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler

import common
from common.checkpoints import save_full_model
from common.data import augment_batch, load_data
from common.faults import crash_one_worker
from common.flags import add_fsdp2_flags, add_ray_flags, add_tp_flag, make_parser
from common.meter import RunMeter, print_run_summary
from common.model import (TRANSFORMER_BLOCK, build_model, count_params, pack_attention,
                          split_attention)
from common.ray_setup import check_cluster_and_choose_gpu, init_options, progress_bar, worker_setup
from common.reporting import epoch_line, gather_from_ranks, peak_memory_mb, this_node
from common.runs import print_best, run_folder, run_name
from common.torch_internals import checkpoint_activations  # torch's composable checkpoint
from common.training import evaluate, make_optimizer, make_scheduler

STEP = "ray_tp"
# Megatron-LM's split of every block: a column-wise layer (each rank computes some of its outputs:
# some heads, some MLP units) feeds a row-wise one (each rank multiplies its share of the inputs,
# and an all-reduce sums the shares into the block's whole output). One all-reduce forward per
# pair, and one backward for the input's gradient of each column-wise layer.
TP_PLAN = {
    "self_attention.q": ColwiseParallel(),  # q, k and v: each rank computes its heads' ...
    "self_attention.k": ColwiseParallel(),
    "self_attention.v": ColwiseParallel(),
    "self_attention.out_proj": RowwiseParallel(),  # ... and projects them: an all-reduce sums
    "mlp.0": ColwiseParallel(),  # the MLP's first layer: each rank its units (GELU is per unit)
    "mlp.3": RowwiseParallel(),  # its second: an all-reduce sums the ranks' shares
}


def main():
    parser = add_ray_flags(make_parser(__doc__, STEP), local_mode=True)
    args = add_tp_flag(add_fsdp2_flags(parser)).parse_args()
    load_data(args.data, args.data_dir, args.eval_images)  # fail here, not in a worker (retried)
    name = run_name(STEP, args)  # --resume: the newest run's; Ray resumes a run given its name
    if args.num_workers:  # 0: Ray Train's local mode, for debugging (README.md in this folder)
        # Starts Ray on this machine, or joins the cluster at --address. Workers on other nodes
        # import common/ from the copy that the job's runtime_env ships them.
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
    # The workers as a grid: rows of --tp ranks (a TP group, which splits each block's matrices)
    # and, down its columns, the dp groups (FSDP2, each rank a shard of what its TP group holds).
    tp = args.tp or world_size  # default: every worker in one TP group
    mesh = init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    # A TP group computes on the same images: the data is split over the dp groups only.
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    # The global batch, split over the dp groups, then into --grad-accum-steps micro-batches.
    micro_batch = args.batch_size // dp_size // args.grad_accum_steps  # checked by the parser
    train_set = data.train_set()  # (image, label, id): augment_batch's randomness comes from ids
    # Each dp group gets a disjoint 1/dp_size of the data: group g takes every dp_size-th index.
    # The seed and the epoch fix the order, so each step's global batch is the same at any size:
    # a run resumed on another mesh trains what an uninterrupted run does, up to rounding.
    sampler = DistributedSampler(train_set, num_replicas=dp_size, rank=dp_rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=micro_batch, sampler=sampler, drop_last=True)
    # prepare_data_loader moves every batch to this worker's device, and keeps our sampler (its own
    # would be seeded with 0 whatever --seed says, and pad the last batches with repeated images).
    train_loader = ray.train.torch.prepare_data_loader(train_loader)
    full_epoch = len(train_loader) // args.grad_accum_steps  # optimizer steps
    steps_per_epoch = min(full_epoch, args.steps_per_epoch or full_epoch)
    micro_steps = steps_per_epoch * args.grad_accum_steps

    # Shapes only, no memory. Training never holds the whole model; rank 0 alone does, briefly:
    # building the first weights, and writing model.pt for inference after the last epoch.
    with torch.device("meta"):
        model = split_attention(build_model(args.model))  # q, k and v apart: each splits by heads
    params = count_params(model)
    parallelize(model, mesh, args)  # replaces prepare_model; the optimizer must come after it
    load_initial_weights(model, args, device)
    optimizer = make_optimizer(model, args, device)
    scheduler = make_scheduler(optimizer, args, steps_per_epoch)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    nodes = gather_from_ranks(this_node())
    if master_process:
        print(f"model {args.model}: {params:,} parameters | data: {data.description} | "
              f"{world_size} x {device.type} on {len(set(nodes))} node(s), "
              f"{micro_batch} x {args.grad_accum_steps} images per step each")

    start_epoch, history = 0, []
    # A checkpoint is there after Ray restarted a failed or resized worker group, or on --resume.
    if checkpoint := ray.train.get_checkpoint():
        state = AppState(model, optimizer, scheduler)
        with checkpoint.as_directory() as checkpoint_dir:
            dcp.load({"app": state}, checkpoint_id=checkpoint_dir)  # each rank reads its slices
        start_epoch, history = state.epoch + 1, state.history
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
            # FSDP2 reduce-scatters the gradients in every backward: until the last micro-batch,
            # skip it (this rank keeps the unsharded gradients meanwhile).
            model.set_requires_gradient_sync(last_micro_batch)
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
        # Every dp group's loss (a TP group's ranks computed the same one), not just rank 0's.
        dist.all_reduce(loss_sum, group=mesh.get_group("dp"))
        train_loss = loss_sum.item() / steps_per_epoch / dp_size  # waits for the GPU: honest
        epoch_seconds = time.perf_counter() - epoch_start

        tally = evaluate(model, data.test_images, data.test_labels, device, dp_rank, dp_size)
        # each dp group scored a disjoint shard of the test set
        dist.all_reduce(tally, group=mesh.get_group("dp"))
        correct, counted = tally.tolist()
        history.append(dict(epoch=epoch + 1, train_loss=train_loss, test_accuracy=correct / counted,
                            epoch_time_s=epoch_seconds, world_size=world_size,
                            images_per_s=steps_per_epoch * args.batch_size / epoch_seconds))
        if master_process:
            print(epoch_line(history[-1], args.epochs, peak_memory_mb(device)))
        meter.save_summary(history)  # a collective; rank 0 writes summary.json in the run's folder
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            state = AppState(model, optimizer, scheduler, epoch, history)
            # Sharded: every rank writes its own slices; Ray merges the ranks' folders into one.
            dcp.save({"app": state}, checkpoint_id=checkpoint_dir)
            if epoch + 1 == args.epochs:
                # step 06 builds build_model's attention: q, k and v packed again
                save_full_model(model, optimizer, Path(checkpoint_dir) / "model.pt", pack_attention)
            checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)
            if master_process:
                checkpoint.set_metadata(dict(model_preset=args.model, epoch=epoch + 1))
            # Ray keeps rank 0's metrics only (reduced over ranks above) and copies the checkpoint
            # to storage. A barrier: every rank must call report, and equally often.
            ray.train.report(history[-1], checkpoint=checkpoint)
        if epoch + 1 == args.fail_at_epoch:  # practice: Ray restarts the group from this checkpoint
            crash_one_worker(rank, world_size)


def parallelize(model, mesh, args) -> None:
    """torchtitan's order: TP inside each block over the mesh's tp dimension (TP_PLAN), then FSDP2
    over its dp dimension, as step 04 (a dp dimension of 1 shards nothing): each block one unit,
    then the root (stem, class token, final norm, head), which TP leaves whole on every rank."""
    policies = {}
    if args.mixed_precision:  # bf16 compute; fp32 sharded weights and gradient reduction
        policies["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                     reduce_dtype=torch.float32)
    if args.cpu_offload:  # shards, gradients and the optimizer step in host memory
        policies["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for module in model.modules():
        if isinstance(module, TRANSFORMER_BLOCK):
            parallelize_module(module, mesh["tp"], TP_PLAN)
            if args.activation_checkpointing:  # backward runs the block's forward again
                checkpoint_activations(module)
            fully_shard(module, mesh=mesh["dp"], reshard_after_forward=args.reshard_after_forward,
                        **policies)
    if args.mixed_precision:  # fp32 logits out of the root, so the loss is computed in fp32
        policies["mp_policy"] = replace(policies["mp_policy"], output_dtype=torch.float32)
    # The root's weights are the first needed in backward: keep them gathered after forward.
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False, **policies)


def load_initial_weights(model, args, device) -> None:
    """The weights DDP starts from (same seed), built on rank 0 alone and sent to the others one
    tensor at a time; each rank keeps only its slices."""
    model.to_empty(device="cpu" if args.cpu_offload else device)  # allocates this rank's shards
    weights = {}
    if dist.get_rank() == 0:
        torch.manual_seed(args.seed)
        weights = split_attention(build_model(args.model)).state_dict()
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True,
                                                                  broadcast_from_rank0=True))


class AppState(Stateful):
    """All that torch.distributed.checkpoint saves: this rank's slices of model and optimizer
    state, by parameter name (they load at any world size), the scheduler, epoch and history."""

    def __init__(self, model, optimizer, scheduler, epoch=-1, history=()):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.epoch, self.history = epoch, history

    def state_dict(self):
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        # history as one JSON string: DCP would flatten a list into keys a fresh run cannot name
        return {"model": model_state, "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch,
                "history": json.dumps(self.history)}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.history = state["epoch"], json.loads(state["history"])


if __name__ == "__main__":
    main()
