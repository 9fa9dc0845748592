"""What every process of a Ray step's job runs first (ray.init's runtime_env, common.ray_setup.WORKER_SETUP). No
torch here: Ray sets a worker's OMP_NUM_THREADS (its CPUs) only after the setup hook runs, and torch reads it once,
on import."""
import logging
import os

import ray

# What a crashed worker makes Ray Train's controller print, tracebacks included, that teaches nothing on a console:
# its failed graceful shutdown of the group ("expected if one of the workers has crashed", it says) and its resource
# requests that time out under load ("safe to ignore"). Filters, set here before Ray Train configures its logging:
# that resets the levels of the "ray.train" loggers' children, not their filters.
CONTROLLER_NOISE = ("ray.train.v2._internal.callbacks.backend_setup",
                    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client")
# How Ray Train logs a worker's failed training function, and where (ray.train.v2._internal.util).
TRAINING_ERROR, TRAINING_ERROR_LOGGER = "Error in training function:", "ray.train.v2._internal.util"


def setup_worker() -> None:
    """Runs first in every process of a Ray step's job: its Ray Train workers, controller and helpers."""
    quiet_report_logs()
    for name in CONTROLLER_NOISE:
        logging.getLogger(name).addFilter(lambda record: record.levelno >= logging.ERROR)
    logging.getLogger(TRAINING_ERROR_LOGGER).addFilter(one_line_on_the_console)
    # Ray's state queries without an address (Train's placement-group cleaner asks them every few seconds whether
    # the controller lives) reach the cluster named by RAY_ADDRESS, else the Ray started last on this machine,
    # which may be another one: when that one stops, the query times out and its thread dies with a traceback.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def quiet_report_logs() -> None:
    """Ray Train logs every ray.train.report at INFO, from every rank, through a logger named after its source file
    (not "ray.train"), which its LoggingConfig does not reach; in local mode, no worker applies that LoggingConfig
    at all. Named without importing that file, which would add half a second to every Ray process's start."""
    context = os.path.join(os.path.dirname(ray.__file__), "train", "v2", "_internal", "execution", "context.py")
    logging.getLogger(context).setLevel(logging.WARNING)
    logging.getLogger("ray.train").setLevel(logging.WARNING)


def one_line_on_the_console(record: logging.LogRecord) -> bool:
    """A filter of the logger through which Ray Train logs a worker's failed training function. When a worker dies,
    the others fail in their next collective, each with a traceback: Ray Train's log file of the worker gets it
    whole, the console its last line and where the whole is."""
    message = record.getMessage()
    if not message.startswith(TRAINING_ERROR):
        return True
    from ray._private.log import PlainRayHandler
    from ray.train.v2._internal.logging.logging import get_train_application_worker_log_path

    whole = get_train_application_worker_log_path() or "Ray Train's worker log, under Ray's logs folder"
    line = f"{TRAINING_ERROR} {message.strip().splitlines()[-1]} (all of it: {whole})"
    short = logging.makeLogRecord(dict(record.__dict__, msg=line, args=()))
    for handler in logging.getLogger("ray.train").handlers:  # where the record would have gone
        handler.handle(short if isinstance(handler, PlainRayHandler) else record)
    return False  # handled
