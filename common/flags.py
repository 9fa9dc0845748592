"""Every step's flags, checked before any work starts.

A bad value ends the run at once with one line on stderr that names the flag, the value and the fix,
and exit code 2 (argparse's code for a bad flag). Under torchrun every rank parses the same flags:
the first process alone prints, the others give it time to (quiet_exit_code) and exit with the same code.
"""
import argparse
import math
import os
import re
import sys
import time
from pathlib import Path

import torch

from .data import DEFAULT_DATA_DIR, EVAL_SIZES, TRAIN_SIZES, cache_exists
from .errors import first_process, quiet_exit_code
from .model import DEFAULT_PRESET, PRESETS
from .profiling import add_profile_flag, check_profile_flag

# Where the steps write by default (checkpoints/, results/): the repository root, whatever folder a
# step runs from. A path given on the command line is taken relative to the current folder, as usual.
REPOSITORY = Path(__file__).resolve().parents[1]


class Parser(argparse.ArgumentParser):
    """argparse, with one-line errors printed once, and every flag checked by `check` as soon as it is parsed."""

    def __init__(self, description: str, check):
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.check = check
        self.local_mode = False  # whether --num-workers 0 is Ray Train's local mode (add_ray_flags)

    def error(self, message):
        if not first_process():
            sys.exit(quiet_exit_code(2))
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)

    def reject(self, args, flag: str, rule: str):
        value = flag_value(args, flag)
        self.error(f"{flag} {'-'.join(map(str, value)) if isinstance(value, tuple) else value} {rule}")

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        self.check(self, parsed)
        return parsed


def flag_value(args, flag: str):
    return getattr(args, flag.removeprefix("--").replace("-", "_"), None)


def make_parser(description: str, step: str) -> Parser:
    p = Parser(description, check_flags)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size, split evenly over processes")
    p.add_argument("--grad-accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step: each process's share of the batch, split again")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate, reached after warmup")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    add_data_flags(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", type=folder_or_uri, default=str(REPOSITORY / "checkpoints" / step))
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="cut every epoch short (smoke runs)")
    p.add_argument("--fail-at-epoch", type=int, help="crash one process after this epoch's checkpoint (practice)")
    add_profile_flag(p)
    p.set_defaults(launched=time.time())  # wall time and time to first step count from here
    return p


def folder_or_uri(text: str) -> str:
    """A folder as an absolute path (Ray's workers start elsewhere); a URI (Ray takes s3://bucket/runs) as it is."""
    return text if "://" in text else str(Path(text).expanduser().resolve())


def add_data_flags(p: Parser) -> None:
    """The model and the images it is scored on: flags the training steps share with step 06 (inference)."""
    p.add_argument("--model", default=DEFAULT_PRESET, choices=PRESETS,
                   help="hybrid: the recipe (75%% in 10 epochs on 2 cores), tiny: 3x fewer parameters, "
                        "small and larger: GPUs and the memory lessons")
    p.add_argument("--data", default="cifar10", choices=list(TRAIN_SIZES),
                   help="cifar10-val holds out the last 5,000 training images and evaluates on them (tuning)")
    p.add_argument("--data-dir", type=folder_or_uri, default=DEFAULT_DATA_DIR,
                   help="holds (or will hold) the CIFAR-10 .npz cache: a path on every node, read by each process")
    p.add_argument("--eval-images", type=int, default=None, help="evaluate on the first N images only (probes)")


def add_fsdp2_flags(parser: Parser) -> Parser:
    """Step 04's own flags (FSDP2's mixed precision, CPU offload and resharding, activation checkpointing), added to
    the others."""
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 compute, fp32 weights and reductions")
    parser.add_argument("--cpu-offload", action="store_true", help="keep shards and optimizer state in host memory")
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                        help="free each block's gathered weights after forward (less memory, one more all-gather)")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="keep each block's input alone, recompute the rest in backward (less memory, "
                             "one more forward of every block)")
    return parser


def add_tp_flag(parser: Parser) -> Parser:
    """Step 07's tensor-parallel degree, added to the others."""
    parser.add_argument("--tp", type=int, default=None,
                        help="workers that split each block's matrices (a TP group; FSDP2 across the groups); "
                             "default: all of them")
    return parser


def add_ray_flags(parser, local_mode: bool = False, elastic: bool = False):
    """The Ray steps' own flags, added to make_parser's; returns the parser. local_mode: the step also
    takes --num-workers 0, Ray Train's local mode (the training function runs in this process). elastic: it also
    takes --num-workers MIN-MAX, which becomes Ray's ScalingConfig(num_workers=(MIN, MAX)) (step 04)."""
    parser.add_argument("--num-workers", type=worker_count if elastic else int, default=2,
                        help="training processes, one GPU each with --use-gpu"
                             + ("; 0: Ray Train's local mode, no Ray (debugging)" if local_mode else "")
                             + ("; MIN-MAX: elastic, as many as the cluster holds (e.g. 1-4)" if elastic else ""))
    parser.local_mode = local_mode
    add_cluster_flags(parser)
    parser.add_argument("--max-failures", type=int, default=3, help="worker-group restarts before giving up")
    return parser


def worker_count(text: str):
    """--num-workers N, an int, or MIN-MAX, Ray's (min, max) tuple for an elastic run (N-N is N), checked with
    the other flags (check_flags)."""
    if bounds := re.fullmatch(r"(\d+)-(\d+)", text.strip()):
        low, high = int(bounds[1]), int(bounds[2])
        return low if low == high else (low, high)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of workers; use N, or MIN-MAX (elastic)")


def add_cluster_flags(parser) -> None:
    """Where the work runs: flags the training steps share with step 06 (inference)."""
    parser.add_argument("--use-gpu", action="store_true", default=None,
                        help="one GPU per worker (default: when the cluster has GPUs)")
    parser.add_argument("--no-gpu", dest="use_gpu", action="store_false", help="CPU workers even on a GPU cluster")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "local"),
                        help="HOST:PORT of a running Ray cluster (default: $RAY_ADDRESS, else 'local': start Ray "
                             "on this machine)")


def check_flags(parser: Parser, args) -> None:
    """Values in range, flags that agree with each other, folders that can be written: before any work."""
    def bad(flag: str, rule: str):
        parser.reject(args, flag, rule)

    check_data_flags(parser, args)
    workers = flag_value(args, "--num-workers")  # Ray's: a number, or (MIN, MAX) in step 04 (elastic)
    if isinstance(workers, tuple):
        if workers[0] < 1:
            bad("--num-workers", "must start at 1 or more (0 is local mode, not part of a range)")
        if workers[0] > workers[1]:
            bad("--num-workers", f"must name the smaller number first: {workers[1]}-{workers[0]}")
    for flag in ("--epochs", "--batch-size", "--grad-accum-steps", "--steps-per-epoch", "--num-workers"):
        if isinstance(flag_value(args, flag), tuple):  # a range, checked above
            continue
        if flag_value(args, flag) == 0 and flag == "--num-workers" and parser.local_mode:
            continue
        if flag_value(args, flag) is not None and flag_value(args, flag) < 1:
            local_mode = flag == "--num-workers" and parser.local_mode
            bad(flag, "must be 0 (Ray Train's local mode) or more" if local_mode else "must be at least 1")
    if flag_value(args, "--num-workers") == 0 and (args.resume or args.fail_at_epoch):
        bad("--num-workers", "is Ray Train's local mode, which keeps no checkpoints; drop --resume and "
                             "--fail-at-epoch, or use --num-workers 1 or more")
    for flag in ("--lr", "--weight-decay", "--warmup-epochs", "--label-smoothing"):
        if not math.isfinite(flag_value(args, flag)):
            bad(flag, "must be a finite number")
    for flag in ("--weight-decay", "--warmup-epochs", "--seed", "--max-failures"):
        if flag_value(args, flag) is not None and not flag_value(args, flag) >= 0:
            bad(flag, "must be 0 or more")
    if not args.lr > 0:
        bad("--lr", "must be greater than 0 (the recipe's is 2e-3)")
    if not 0 <= args.label_smoothing < 1:
        bad("--label-smoothing", "must be at least 0 and below 1 (the recipe's is 0.1)")
    if args.warmup_epochs > args.epochs:
        bad("--warmup-epochs", f"is longer than --epochs {args.epochs}; use at most {args.epochs}")
    if args.fail_at_epoch is not None and not 1 <= args.fail_at_epoch <= args.epochs:
        bad("--fail-at-epoch", f"must be between 1 and --epochs {args.epochs}")
    world_size = workers or int(os.environ.get("WORLD_SIZE", "1"))  # Ray's, or torchrun's
    check_gpus_per_node(parser)
    if hasattr(args, "tp"):  # step 07: the ranks of a TP group train on the same images
        check_tp_flag(parser, args, world_size)
        world_size //= world_size if args.tp is None else args.tp
    # The global batch stays the same whatever the number of processes: an elastic run may train at any size of
    # its range, and each process's share must be whole at every one of them.
    sizes = range(world_size[0], world_size[1] + 1) if isinstance(world_size, tuple) else [world_size]
    every = math.lcm(*sizes)  # a batch that splits over every size
    of_range = f", one of the sizes of --num-workers {world_size[0]}-{world_size[1]}" if len(sizes) > 1 else ""
    for size in sizes:
        if args.batch_size % size:
            bad("--batch-size", f"does not split evenly over {size} processes{of_range}; use a multiple of {every}")
        if args.batch_size % (size * args.grad_accum_steps):
            bad("--batch-size", f"does not split evenly over {size} process(es) x --grad-accum-steps "
                                f"{args.grad_accum_steps}{of_range}; use a multiple of {every * args.grad_accum_steps}")
    if args.batch_size > TRAIN_SIZES[args.data]:
        bad("--batch-size", f"is larger than the {TRAIN_SIZES[args.data]:,} training images; use at most that")
    if "://" not in args.checkpoint_dir and not can_create(args.checkpoint_dir):
        bad("--checkpoint-dir", "cannot be created or written; pass a writable folder")
    check_profile_flag(parser, args, TRAIN_SIZES[args.data])


def check_tp_flag(parser: Parser, args, world_size: int) -> None:
    """--tp: a TP group's ranks split every block's heads and MLP units, and the workers form whole groups."""
    tp = world_size if args.tp is None else args.tp
    preset = PRESETS[args.model]
    if tp < 1:
        parser.reject(args, "--tp", "must be at least 1")
    if world_size % tp:
        workers = f"--num-workers {world_size}" if args.num_workers else "local mode's 1 process"
        parser.reject(args, "--tp", f"does not divide {workers} into whole TP groups; use a divisor of {world_size}")
    for count, what in ((preset["num_heads"], "attention heads"), (preset["mlp_dim"], "MLP units")):
        if count % tp:
            parser.reject(args, "--tp", f"does not split --model {args.model}'s {count} {what} evenly; use a "
                                        f"divisor of {count}")


def check_gpus_per_node(parser: Parser) -> None:
    """Under torchrun: one process per GPU, so --nproc_per_node at most the node's GPU count (a process
    would otherwise pick a GPU that does not exist and fail with a CUDA error)."""
    processes, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
    if gpus and processes > gpus:
        parser.error(f"--nproc_per_node {processes} is more than this node's {gpus} GPU(s), one process each; "
                     f"use --nproc_per_node {gpus}")


def check_data_flags(parser: Parser, args) -> None:
    """The flags of add_data_flags."""
    if args.eval_images is not None and args.eval_images < 1:
        parser.reject(args, "--eval-images", "must be at least 1")
    if args.eval_images and args.eval_images > EVAL_SIZES[args.data]:
        parser.reject(args, "--eval-images",
                      f"is more than the {EVAL_SIZES[args.data]:,} evaluation images of --data {args.data}")
    if args.data != "synthetic" and not cache_exists(Path(args.data_dir)) and not can_create(args.data_dir):
        parser.reject(args, "--data-dir", "has no CIFAR-10 cache and cannot be created to download one; "
                                          "pass a writable folder")


def can_create(folder: str) -> bool:
    """The folder is writable, or could be made: its nearest existing ancestor is a writable folder."""
    path = Path(folder)
    while not path.exists():
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)
