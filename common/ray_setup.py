"""Ray plumbing shared by the Ray steps (02-06): Ray's console noise turned down, the job's runtime environment, a
progress bar from a worker drawn by the driver, one-line errors when the cluster can never run the job, and Ray
Train's local mode. Their flags are common/flags.py's, runs by name common/runs.py's."""
import logging
import os
import socket
import sys
import traceback

import ray
import ray.train
import torch
from ray.experimental import tqdm_ray

from .errors import fail
from .flags import flag_value
from .ray_internals import (POLL_INTERVAL, PREEMPTION_WATCHER, PRINT_PATCH, WORKER_GROUP_START_TIMEOUT,
                            key_progress_bar)
from .rendezvous import free_port
from .worker_setup import quiet_report_logs

POLL_INTERVAL_S = 0.2  # how often Ray Train's controller polls the workers (see init_options)
# An elastic run (--num-workers MIN-MAX) asks this often whether the cluster now holds more or fewer workers:
# ScalingConfig(elastic_resize_monitor_interval_s), 60 s by default as in Ray. Ray reads no variable for it: the
# step reads this one, which the tests shorten.
RESIZE_CHECK_INTERVAL_S = float(os.environ.get("RAY_TRAIN_ELASTIC_MONITOR_INTERVAL_S", "60"))
# How long Ray Train waits for a worker group's resources before it tries again (Ray's default: 60 s). After a node
# is lost, an elastic run first retries at the size it last saw, which no longer fits: it waits this long.
ELASTIC_START_TIMEOUT_S = 10


def init_options(address: str) -> dict:
    """ray.init's arguments in every step but the address and the runtime environment: Ray's own INFO and
    WARNING lines turned off (worker errors still shown, identical lines from several workers once). Sets
    the environment that Ray hands on to its controller and workers: the steps' controller poll, no copy
    of every print into Ray Train's logger (each line would show twice), and on a Ray started here no
    PreemptionWatcher (it watches for spot instances being drained; its start-up line looks like an error)."""
    if address not in ("local", "auto"):
        check_reachable(address)
        explain_a_refused_driver(address)
    os.environ.setdefault(PRINT_PATCH, "0")
    # Every ray.train.report waits for the controller's next poll of the workers: every 2 s by default.
    os.environ.setdefault(POLL_INTERVAL, str(POLL_INTERVAL_S))
    if address == "local":
        os.environ.setdefault(PREEMPTION_WATCHER, "0")
    return dict(logging_level=logging.WARNING, log_to_driver=True,
                logging_config=ray.LoggingConfig(log_level="ERROR"))


DRIVER = "WORKSHOP_RAY_DRIVER"  # the driver's node address and process id, for progress_bar


def worker_setup() -> dict:
    """The job's runtime_env beyond the code it ships (ray.init's runtime_env in every Ray step), called by the
    driver: prints from workers reach the console at once, every process of the job runs setup_worker first, and
    knows the driver (for progress_bar)."""
    return {"env_vars": {"PYTHONUNBUFFERED": "1", DRIVER: f"{ray.util.get_node_ip_address()} {os.getpid()}"},
            "worker_process_setup_hook": "common.worker_setup.setup_worker"}


def progress_bar(batches, total: int, desc: str, show: bool):
    """The batches, with a progress bar on the rank that shows it: Ray's tqdm_ray, which sends its state to
    the driver, where one bar is drawn in place. A plain tqdm in a worker reaches the driver as a new line
    at every update (Ray forwards a worker's output line by line)."""
    if not show:
        yield from batches
        return
    bar = tqdm_ray.tqdm(total=total, desc=desc)
    if DRIVER in os.environ:  # Ray's driver draws it as its own bar: one per run and epoch, whatever draws it
        # The driver keys a bar by the process that sends it: a worker that dies mid-epoch would leave its bar
        # drawn, and redrawn under every line to the end of the run. Keyed by run and epoch instead, the bar of
        # the restarted worker group takes its place.
        ip, pid = os.environ[DRIVER].split()
        key_progress_bar(bar, ip, int(pid), f"{ray.train.get_context().get_experiment_name()} {desc}")
    for batch in batches:
        yield batch
        bar.update(1)
    bar.close()


def check_reachable(address: str) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise fail(f"no Ray cluster answers at --address {address} ({e}); start one with `ray start --head` "
                   f"there, or leave --address out to start one on this machine")


AUTH_MODE = "RAY_AUTH_MODE"  # Ray 2.60's token authentication: "token" on every node and driver, or "disabled"


def explain_a_refused_driver(address: str) -> None:
    """A head that has a token (~/.ray/auth_token) refuses every connection without it, and ray.init then ends, after
    about 20 s of retries, in "Failed to connect to Ray cluster": said here in one line, with the fix."""
    if AUTH_MODE in os.environ:
        return
    shown = sys.excepthook

    def one_line(kind, error, tb):
        if issubclass(kind, ConnectionError) and tb and traceback.extract_tb(tb)[-1].name == "init":
            print(f"error: the Ray cluster at --address {address} refused this driver ({error}); if its head "
                  f"uses token authentication, set {AUTH_MODE}=token here and copy the head's ~/.ray/auth_token "
                  f"to this machine's ~/.ray/ (README: Running on a cluster)", file=sys.stderr)
        else:
            shown(kind, error, tb)

    sys.excepthook = one_line


def check_cluster_and_choose_gpu(args, flag: str = "--num-workers", cpu_each: bool = False) -> bool:
    """Whether the workers (or step 06's actors: flag="--actors") use GPUs (--use-gpu, --no-gpu, else: if the
    cluster has any), after checking that the cluster can ever hold them (an elastic range: its MIN): Ray would
    wait for them forever. Each asks Ray for a GPU alone on GPUs (a Ray Train worker: ScalingConfig's default),
    else a CPU; cpu_each: a CPU always, beside its GPU (step 06's actor: map_batches' num_cpus=1)."""
    count = flag_value(args, flag)
    if count == 0:
        return prepare_local_mode(args)
    request, use = f"{flag} {count}", f"{flag} "
    if isinstance(count, tuple):  # --num-workers MIN-MAX, elastic: the run starts as soon as MIN workers fit
        request, use, count = f"{flag} {count[0]}-{count[1]}", "a MIN of ", count[0]
        # After a node is lost, Ray first retries the group at the size it last saw: wait less than a minute.
        os.environ.setdefault(WORKER_GROUP_START_TIMEOUT, str(ELASTIC_START_TIMEOUT_S))
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    use_gpu = gpus > 0 if args.use_gpu is None else args.use_gpu
    if use_gpu and gpus == 0:
        raise fail("--use-gpu but this Ray cluster has no GPUs; drop --use-gpu to run on CPUs")
    if use_gpu and count > gpus:
        raise fail(f"{request} needs {count} GPUs, the cluster has {gpus}; use {use}{gpus} or fewer, "
                   f"or --no-gpu to train on CPUs")
    if count > cpus and (cpu_each or not use_gpu):
        raise fail(f"{request} needs {count} CPUs, the cluster has {cpus}; use {use}{cpus} or fewer")
    return use_gpu


def prepare_local_mode(args) -> bool:
    """Ray Train's local mode (ScalingConfig(num_workers=0)) runs the training function in this process, or in
    each process torchrun started, and starts a torch process group only under torchrun. A plain process gets
    the environment of a one-process torchrun, so that it has a process group too (of one) and the training
    function runs unchanged. Local mode trains on this machine's GPU if it has one, whatever --use-gpu says."""
    if args.use_gpu is not None and args.use_gpu != torch.cuda.is_available():
        raise fail(f"--num-workers 0 (local mode) trains on {'the' if torch.cuda.is_available() else 'no'} GPU of "
                   f"this machine; drop --use-gpu and --no-gpu")
    quiet_report_logs()  # no Ray job here, so no setup_worker
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return torch.cuda.is_available()
