"""Driver-side plumbing shared by the Ray steps (02-04): connect to Ray quietly, fail fast with one
line when the cluster can never run the job, and name runs so that --resume finds the last one."""
import logging
import os
import socket
import time
from pathlib import Path

import ray
import ray.train

from .data import SYNTHETIC_SIZES, VALIDATION_SIZE
from .training import per_rank_batch_size

TRAIN_SIZES = {"cifar10": 50_000, "cifar10-val": 50_000 - VALIDATION_SIZE, "synthetic": SYNTHETIC_SIZES["train"]}


def add_ray_flags(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2, help="training processes (one GPU each with --use-gpu)")
    parser.add_argument("--use-gpu", action="store_true", default=None,
                        help="one GPU per worker (default: when the cluster has GPUs)")
    parser.add_argument("--no-gpu", dest="use_gpu", action="store_false", help="CPU workers even on a GPU cluster")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="HOST:PORT of a running Ray cluster (default: $RAY_ADDRESS, else start one here)")
    parser.add_argument("--max-failures", type=int, default=3, help="worker-group restarts before giving up")


def start_ray(address: str | None) -> None:
    """Connect to (or start) Ray with its console noise turned down, but worker errors still shown
    (Ray already prints identical lines from several workers once, with a count).

    Workers on other nodes import `common` from the copy shipped in the runtime environment."""
    if address and address != "auto":
        check_reachable(address)
    import common

    # Ray Train copies every print in a worker into its own logger too, which echoes it on stderr: each
    # line would show twice. Ray hands this variable on to its controller and workers.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    ray.init(address=address or "local", logging_level=logging.WARNING, log_to_driver=True,
             logging_config=ray.LoggingConfig(log_level="ERROR"),  # Ray's own INFO and WARNING lines in workers
             runtime_env={"py_modules": [common], "env_vars": {"PYTHONUNBUFFERED": "1"}})


def check_reachable(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: no Ray cluster answers at --address {address} ({e}); start one with "
                         f"`ray start --head` there, or leave --address out to start one on this machine")


def check_cluster_can_run(args) -> bool:
    """Return use_gpu, after checking the cluster can ever hold the workers (Ray would wait forever)."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    use_gpu = gpus > 0 if args.use_gpu is None else args.use_gpu
    if use_gpu and gpus == 0:
        raise SystemExit("error: --use-gpu but this Ray cluster has no GPUs; drop --use-gpu to train on CPUs")
    if use_gpu and args.num_workers > gpus:
        raise SystemExit(f"error: --num-workers {args.num_workers} needs {args.num_workers} GPUs, the cluster has "
                         f"{gpus}; use --num-workers {gpus} or fewer")
    if args.num_workers > cpus:
        raise SystemExit(f"error: --num-workers {args.num_workers} needs {args.num_workers} CPUs, the cluster has "
                         f"{cpus}; use --num-workers {cpus} or fewer")
    per_rank_batch_size(args.batch_size, args.num_workers, TRAIN_SIZES[args.data])
    return use_gpu


def run_name(step: str, storage: Path, resume: bool) -> str:
    """A new run gets a fresh name; --resume reuses the newest run's name, which makes Ray restore it."""
    if not resume:
        return f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = sorted(p.name for p in storage.glob(f"{step}-*") if p.is_dir())
    if not runs:
        raise SystemExit(f"error: --resume but no {step} run in {storage}; run without --resume to start fresh")
    return runs[-1]


def check_resumable(storage: Path, run: str, preset: str) -> None:
    """Check the run's checkpoints here, on the driver, from their metadata: an error inside a worker
    would count as a worker failure and be retried --max-failures times."""
    for path in (storage / run).glob("checkpoint_*/"):
        saved = ray.train.Checkpoint(str(path)).get_metadata().get("model_preset")
        if saved and saved != preset:
            raise SystemExit(f"error: {path} holds a --model {saved} checkpoint, not {preset}; "
                             f"pass --model {saved} or another --checkpoint-dir")
