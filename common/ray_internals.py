"""Every private name of Ray (2.60) that the steps use, in one place, each with why no public way does it.
tests/test_ray_internals.py fails when a Ray release moves or renames one. No torch here: worker_setup imports
this before Ray sets a worker's thread count."""
import os

import ray

# Environment variables that Ray Train reads (ray/train/v2/_internal/constants.py), set by init_options.
PRINT_PATCH = "RAY_TRAIN_ENABLE_PRINT_PATCH"  # "0": no copy of every print into Ray Train's logger
POLL_INTERVAL = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # the controller's poll of the workers: 2 s by default
PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # "0": no spot-instance watcher actor
WORKER_GROUP_START_TIMEOUT = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # elastic: how long a group may take to start

# Loggers, by the module names Ray Train logs under: a crashed worker's lines that teach nothing on a console (the
# controller's failed graceful shutdown, its resource requests timing out under load) and the one through which a
# worker's failed training function is logged, with this message. LoggingConfig sets levels only, not filters.
CONTROLLER_NOISE = ("ray.train.v2._internal.callbacks.backend_setup",
                    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client")
TRAINING_ERROR, TRAINING_ERROR_LOGGER = "Error in training function:", "ray.train.v2._internal.util"
# ray.train.report's INFO line, from every rank, goes through a logger named after its source file, not under
# "ray.train": LoggingConfig does not reach it. Named without importing that file (half a second per process).
REPORT_LOGGER = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution", "context.py")
# Where ray.train.report is defined, beside its public name ray.train: a lab's check watches it in both (labs/watch.py).
REPORT_MODULE = "ray.train.v2.api.train_fn_utils"


def console_handler_class() -> type:
    """The handler class of Ray's console output, to tell it from its log files' handlers."""
    from ray._private.log import PlainRayHandler
    return PlainRayHandler


def worker_log_path() -> str | None:
    """This Ray Train worker's log file, where the whole of a traceback goes."""
    from ray.train.v2._internal.logging.logging import get_train_application_worker_log_path
    return get_train_application_worker_log_path()


def key_progress_bar(bar, ip: str, pid: int, key: str) -> None:
    """tqdm_ray's driver keys a bar by the process that sent it (ip, pid) and a random uuid: keyed by the driver's
    process and a key of ours instead, a restarted worker's bar replaces the dead one's, which would otherwise stay
    drawn to the end of the run. tqdm_ray has no argument for it."""
    bar._ip, bar._pid, bar._uuid = ip, pid, key
