"""Driver-side plumbing shared by the Ray steps (02-04): connect to Ray quietly, fail fast with one
line when the cluster can never run the job, and name runs so that --resume finds the last one."""
import logging
import os
import socket
import time
from pathlib import Path

import ray
import ray.train

from .errors import fail
from .flags import flag_value
from .training import check_compatible

POLL_INTERVAL_S = 0.2  # how often Ray Train's controller polls the workers (see start_ray)


def add_ray_flags(parser):
    """The Ray steps' own flags, added to make_parser's; returns the parser."""
    parser.add_argument("--num-workers", type=int, default=2, help="training processes (one GPU each with --use-gpu)")
    add_cluster_flags(parser)
    parser.add_argument("--max-failures", type=int, default=3, help="worker-group restarts before giving up")
    return parser


def add_cluster_flags(parser) -> None:
    """Where the work runs: flags the training steps share with step 06 (inference)."""
    parser.add_argument("--use-gpu", action="store_true", default=None,
                        help="one GPU per worker (default: when the cluster has GPUs)")
    parser.add_argument("--no-gpu", dest="use_gpu", action="store_false", help="CPU workers even on a GPU cluster")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="HOST:PORT of a running Ray cluster (default: $RAY_ADDRESS, else start one here)")


def start_ray(address: str | None) -> None:
    """Connect to (or start) Ray with its console noise turned down, but worker errors still shown
    (Ray already prints identical lines from several workers once, with a count).

    Workers on other nodes import `common` from the copy shipped in the runtime environment."""
    if address and address != "auto":
        check_reachable(address)
    import common

    # Ray Train copies every print in a worker into its own logger too, which echoes it on stderr: each
    # line would show twice. Ray hands these variables on to its controller and workers.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    # Every ray.train.report waits for the controller's next poll of the workers: every 2 s by default.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(POLL_INTERVAL_S))
    ray.init(address=address or "local", logging_level=logging.WARNING, log_to_driver=True,
             logging_config=ray.LoggingConfig(log_level="ERROR"),  # Ray's own INFO and WARNING lines in workers
             runtime_env={"py_modules": [common], "env_vars": {"PYTHONUNBUFFERED": "1"}})


def quiet_report_logs() -> None:
    """Call in each worker. Ray Train logs every ray.train.report at INFO, from every rank, through a logger
    named after its source file (not "ray.train"), which its LoggingConfig does not reach."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def check_reachable(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise fail(f"no Ray cluster answers at --address {address} ({e}); start one with `ray start --head` "
                   f"there, or leave --address out to start one on this machine")


def check_cluster_and_choose_gpu(args, flag: str = "--num-workers") -> bool:
    """Whether the workers (or step 06's actors: flag="--actors") use GPUs (--use-gpu, --no-gpu, else: if the
    cluster has any), after checking that the cluster can ever hold them: Ray would wait for them forever."""
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    use_gpu = gpus > 0 if args.use_gpu is None else args.use_gpu
    count = flag_value(args, flag)
    if use_gpu and gpus == 0:
        raise fail("--use-gpu but this Ray cluster has no GPUs; drop --use-gpu to run on CPUs")
    if use_gpu and count > gpus:
        raise fail(f"{flag} {count} needs {count} GPUs, the cluster has {gpus}; use {flag} {gpus} or fewer")
    if count > cpus:
        raise fail(f"{flag} {count} needs {count} CPUs, the cluster has {cpus}; use {flag} {cpus} or fewer")
    return use_gpu


def run_name(step: str, args) -> str:
    """A new run gets a fresh name; --resume reuses the newest run's name, which makes Ray restore it.
    Checked here, on the driver, from the checkpoints' metadata: an error inside a worker would count as
    a worker failure and be retried --max-failures times."""
    if not args.resume:
        return f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
    if "://" in args.checkpoint_dir:
        raise fail(f"--resume finds the last run in a local or mounted --checkpoint-dir, not {args.checkpoint_dir}")
    runs = sorted(p for p in Path(args.checkpoint_dir).glob(f"{step}-*") if p.is_dir())
    if not runs:
        raise fail(f"--resume but no {step} run in {args.checkpoint_dir}; run without --resume to start fresh")
    checkpoints = sorted(runs[-1].glob("checkpoint_*/"))
    if checkpoints:
        saved = ray.train.Checkpoint(str(checkpoints[-1])).get_metadata()
        check_compatible(checkpoints[-1], saved["model_preset"], saved["epoch"], args)
    return runs[-1].name
